"""Stage ppo end to end through the CLI on tiny models: the mean reward rises when an API
reward model prefers lowercase text; LLaMA-Factory's llama3_lora_ppo.yaml runs with the
reward adapter of LLaMA-Factory's reward example (both on tiny models); a full reward
model; the reward adapter scores as a separately loaded one; clear errors."""

from __future__ import annotations

import json
import shutil
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file, save_file

from tiny import save_tiny_model, write_alpaca
from tunesmith.cli.main import main
from tunesmith.config import load_config
from tunesmith.errors import ConfigError, TrainingError
from tunesmith.recipes.stages import run_stage

FIXTURES = Path(__file__).parent / "fixtures"
ASSISTANT = "<|im_start|>assistant\n"


class LowercaseScorer(BaseHTTPRequestHandler):
    """A reward API: the share of lowercase characters in each message's answer."""

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        scores = []
        for text in body["messages"]:
            answer = text.rsplit(ASSISTANT, 1)[-1]
            scores.append(sum(c.islower() for c in answer) / max(len(answer), 1))
        reply = json.dumps({"scores": scores}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def scorer_url():
    server = ThreadingHTTPServer(("127.0.0.1", 0), LowercaseScorer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/score"
    server.shutdown()
    server.server_close()


def _peaked_model(folder: Path) -> Path:
    """A tiny model whose output head is scaled up, so its next-token distribution is
    peaked (entropy ~1.6 nats, not ~6) and a small LoRA can move probability mass."""
    save_tiny_model(folder)
    weights = load_file(str(folder / "model.safetensors"))
    weights["lm_head.weight"] = weights["lm_head.weight"] * 30.0
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def _records(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def test_mean_reward_rises_with_an_api_reward_model(tmp_path, scorer_url):
    data = tmp_path / "data"
    data.mkdir()
    write_alpaca(data / "alpaca.json", 16)
    (data / "dataset_info.json").write_text(json.dumps({"alpaca": {"file_name": "alpaca.json"}}))
    keys = {"model_name_or_path": str(_peaked_model(tmp_path / "tiny")), "stage": "ppo",
            "dataset": "alpaca", "dataset_dir": str(data), "output_dir": str(tmp_path / "out"),
            "reward_model": scorer_url, "reward_model_type": "api", "ppo_score_norm": True,
            "max_steps": 8, "per_device_train_batch_size": 8, "ppo_epochs": 2,
            "learning_rate": 0.005, "lr_scheduler_type": "constant", "max_new_tokens": 8,
            "temperature": 1.0, "top_p": 1.0, "top_k": 0, "logging_steps": 1,
            "save_steps": 0, "seed": 42}
    (tmp_path / "ppo.yaml").write_text(yaml.safe_dump(keys))
    assert main(["train", str(tmp_path / "ppo.yaml")]) == 0
    records = _records(tmp_path / "out")
    assert [r["step"] for r in records] == list(range(1, 9))
    for key in ("reward", "kl", "kl_coef", "policy_loss", "value_loss", "entropy",
                "clipfrac", "approx_kl", "response_length", "lr"):
        assert all(key in r for r in records), key
    rewards = [r["reward"] for r in records]
    # no update (learning_rate 1e-12): 0.50 -> 0.45; trained: 0.57 -> 0.74
    assert sum(rewards[-3:]) / 3 - sum(rewards[:2]) / 2 > 0.1, rewards
    assert records[-1]["kl"] > 0.5  # the policy left the reference
    head = load_file(str(tmp_path / "out" / "value_head.safetensors"))
    assert set(head) == {"v_head.summary.weight", "v_head.summary.bias"}  # LLaMA-Factory's
    assert (tmp_path / "out" / "adapter_model.safetensors").is_file()


@pytest.fixture(scope="module")
def reward_adapter(tmp_path_factory, tiny_llama_dir):
    """LLaMA-Factory's reward example (qwen3_lora_reward.yaml) on the tiny model: one step."""
    root = tmp_path_factory.mktemp("ppo-rm")
    data = Path(shutil.copytree(FIXTURES / "lf_pref", root / "data"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TUNESMITH_CACHE", str(root / "cache"))
        code = main(["train", str(data / "qwen3_lora_reward.yaml"),
                     f"model_name_or_path={tiny_llama_dir}", "template=", f"dataset_dir={data}",
                     f"output_dir={root / 'rm'}", "max_steps=1", "learning_rate=0.05"])
    assert code == 0
    return root / "rm"


def test_llamafactory_ppo_example_runs(tmp_path, tiny_llama_dir, reward_adapter):
    data = FIXTURES / "llamafactory_data"  # identity, alpaca_en_demo
    out = tmp_path / "ppo"
    code = main(["train", str(FIXTURES / "lf_pref" / "llama3_lora_ppo.yaml"),
                 f"model_name_or_path={tiny_llama_dir}", "template=", f"dataset_dir={data}",
                 f"output_dir={out}", f"reward_model={reward_adapter}", "max_steps=2",
                 "max_new_tokens=6", "logging_steps=1", "preprocessing_num_workers=1",
                 "dataloader_num_workers=0", "gradient_accumulation_steps=2", "save_steps=1"])
    assert code == 0
    records = _records(out)
    assert [r["step"] for r in records] == [1, 2]
    assert all(abs(r["reward"]) > 0 for r in records)  # the reward head's scores
    for folder in (out, out / "checkpoint-1"):  # LLaMA-Factory's layout, in checkpoints too
        assert (folder / "adapter_model.safetensors").is_file()
        assert (folder / "value_head.safetensors").is_file()
        assert not (folder / "reward").exists()  # only the policy's adapter is saved
    cfg = json.loads((out / "adapter_config.json").read_text())
    assert cfg["r"] == 8
    assert (out / "value_head.safetensors").is_file()
    resolved = yaml.safe_load((out / "config.resolved.yaml").read_text())
    assert resolved["top_p"] == 0.9 and resolved["top_k"] == 0  # the example's generate keys
    # continuing from this output (adapter_name_or_path) starts from its value head
    again = tmp_path / "again"
    assert main(["train", str(FIXTURES / "lf_pref" / "llama3_lora_ppo.yaml"),
                 f"model_name_or_path={tiny_llama_dir}", "template=", f"dataset_dir={data}",
                 f"output_dir={again}", f"reward_model={reward_adapter}", "max_steps=1",
                 "max_new_tokens=4", "preprocessing_num_workers=1", "learning_rate=1e-12",
                 f"adapter_name_or_path={out}", "gradient_accumulation_steps=1"]) == 0
    before = load_file(str(out / "value_head.safetensors"))
    after = load_file(str(again / "value_head.safetensors"))
    assert all(torch.allclose(before[k], after[k], atol=1e-6) for k in before)


def test_reward_adapter_scores_like_a_separately_loaded_one(tiny_llama_dir, reward_adapter):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from tunesmith.adapters.setup import apply_lora
    from tunesmith.config.schema import FinetuningConfig
    from tunesmith.train.objectives.reward import load_value_head
    from tunesmith.train.ppo_reward import REWARD_ADAPTER, HeadReward
    from tunesmith.train.ppo_rollout import build_sequences, trunk_rows

    policy = apply_lora(AutoModelForCausalLM.from_pretrained(tiny_llama_dir),
                        FinetuningConfig(lora_rank=4))
    for name, p in policy.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.1)  # the policy's adapter is not a no-op
    trainable = {n for n, p in policy.named_parameters() if p.requires_grad}
    policy.load_adapter(str(reward_adapter), adapter_name=REWARD_ADAPTER, is_trainable=False)
    head = load_value_head(reward_adapter, policy.config.hidden_size)
    queries, responses = [[5, 6, 7, 8], [9, 10]], [[11, 12], [13, 14, 15]]
    got = HeadReward(policy, head, 0, adapter=REWARD_ADAPTER).scores(queries, responses)
    alone = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_llama_dir),
                                      str(reward_adapter))
    seqs = build_sequences(queries, responses, 0, torch.device("cpu"))
    with torch.no_grad():
        want = head(trunk_rows(alone, seqs).index_select(0, seqs.last))
    assert torch.allclose(got, want, atol=1e-5)
    assert policy.active_adapter == "default"
    assert {n for n, p in policy.named_parameters() if p.requires_grad} == trainable


def test_full_reward_model_through_the_cli(tmp_path, tiny_llama_dir, reward_adapter):
    data = tmp_path / "data"
    data.mkdir()
    write_alpaca(data / "alpaca.json", 8)
    rows = [{"instruction": f"Q{i}", "chosen": "Yes.", "rejected": "No."} for i in range(4)]
    (data / "pairs.json").write_text(json.dumps(rows))
    (data / "dataset_info.json").write_text(json.dumps(
        {"alpaca": {"file_name": "alpaca.json"},
         "pairs": {"file_name": "pairs.json", "ranking": True}}))
    common = [f"model_name_or_path={tiny_llama_dir}", f"dataset_dir={data}", "save_steps=0",
              "max_steps=1", "per_device_train_batch_size=4"]
    assert main(["train", "stage=rm", "dataset=pairs", "finetuning_type=full",
                 f"output_dir={tmp_path / 'rm'}", *common]) == 0
    assert main(["train", "stage=ppo", "dataset=alpaca", "reward_model_type=full",
                 f"reward_model={tmp_path / 'rm'}", f"output_dir={tmp_path / 'ppo'}",
                 "max_new_tokens=4", "ppo_epochs=1", "ppo_buffer_size=2",
                 "ppo_whiten_rewards=true", "ppo_target=1.0", *common]) == 0
    records = _records(tmp_path / "ppo")
    assert len(records) == 1 and records[0]["reward"] != 0
    # the base + reward_model_adapters (merged; the value head from the last adapter)
    assert main(["train", "stage=ppo", "dataset=alpaca", "reward_model_type=full",
                 f"reward_model={tiny_llama_dir}", f"reward_model_adapters={reward_adapter}",
                 f"output_dir={tmp_path / 'ppo2'}", "max_new_tokens=4", "ppo_epochs=1",
                 *common]) == 0
    assert len(_records(tmp_path / "ppo2")) == 1


def test_clear_errors(tmp_path, tiny_llama_dir):
    base = {"model_name_or_path": str(tiny_llama_dir), "stage": "ppo", "dataset": "x",
            "output_dir": str(tmp_path / "o")}
    with pytest.raises(ConfigError, match="reward_model: not set"):
        run_stage(load_config(overrides=base))
    with pytest.raises(ConfigError, match="finetuning_type: 'full' with stage ppo"):
        run_stage(load_config(overrides={**base, "reward_model": "r", "finetuning_type": "full",
                                         "reward_model_type": "full"}))
    with pytest.raises(ConfigError) as err:
        run_stage(load_config(overrides={**base, "reward_model": "r",
                                         "reward_model_quantization_bit": 4,
                                         "reward_model_adapters": "a"}))
    assert "reward_model_quantization_bit: 4 is not supported yet" in str(err.value)
    assert "reward_model_adapters: set, but reward_model_type is 'lora'" in str(err.value)
    with pytest.raises(ConfigError, match="reward_model: '.*/r' has no value_head"):
        run_stage(load_config(overrides={**base, "reward_model": str(tmp_path / "r")}))
    write_alpaca(tmp_path / "a.json", 4)
    with pytest.raises(ConfigError, match="gave no prompts for stage ppo"):  # all trained
        run_stage(load_config(overrides={**base, "reward_model": "http://127.0.0.1:9/score",
                                         "reward_model_type": "api", "train_on_prompt": True,
                                         "dataset": str(tmp_path / "a.json")}))
    from tunesmith.train.ppo_reward import ApiReward

    api = ApiReward("http://127.0.0.1:9/score", lambda ids: "text", timeout_s=5)
    with pytest.raises(TrainingError, match=r"reward_model: the scoring API "
                                            r"'http://127.0.0.1:9/score' could not be reached"):
        api.scores([[1]], [[2]])
