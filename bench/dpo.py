"""DPO throughput benchmark: tunesmith (through `tunesmith train`, as users run it) against
LLaMA-Factory's DPO on the same model and the same pairs.

    python bench/dpo.py --out $OUT                         # tunesmith only, own assets
    python bench/dpo.py --out $OUT --peers .carry/peers    # + LLaMA-Factory (peers recipe)
    python bench/dpo.py --out $OUT --peers .carry/peers --skip-lf --configs padded
                                                           # later calls: same assets, no LF
    python bench/dpo.py --tiny --out /tmp/dpo              # CPU: tiny shapes, a few steps

Workload: a Qwen2.5-7B-shaped model with random weights, LoRA r16 on every projection,
alpaca-style pairs whose answers have log-normal lengths, 2 pairs per micro-batch, no
activation recompute, bf16. With --peers, the peers recipe (PEERS_LF_STAGE=dpo) builds the
model, tokenizer and pairs and runs LLaMA-Factory 0.9.5 + Liger on them first; tunesmith
then trains on exactly those files. Without it, this script builds its own (same shapes).

tokens/s counts chosen + rejected tokens (no padding) over the steady-state steps; peak
memory is torch's peak allocated GPU memory. Writes dpo.json and dpo.md to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
WORDS = ("the model data answer question token layer weight train learn value time system "
         "user first second result number method paper reason example simple large small "
         "fast slow good better best because which where while after before under over").split()

GPU_ONLY = ("attn_implementation", "enable_liger_kernel", "torch_compile")
# name -> tunesmith keys on top of the common ones
CONFIGS: dict[str, dict] = {
    "padded": {},
    "packed-varlen": {"packing": True, "attn_implementation": "varlen"},
    "packed-varlen-liger": {"packing": True, "attn_implementation": "varlen",
                            "enable_liger_kernel": True},
    "packed-varlen-liger-compile": {"packing": True, "attn_implementation": "varlen",
                                    "enable_liger_kernel": True, "torch_compile": True},
    "packed-varlen-precomputed-ref": {"packing": True, "attn_implementation": "varlen",
                                      "precompute_ref_log_probs": True},
}


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words)).capitalize() + "."


def build_pairs(n: int, seed: int, tiny: bool) -> list[dict]:
    """Alpaca pairs: one prompt, two answers with log-normal word counts."""
    rng = random.Random(seed)
    median, cap = (12, 60) if tiny else (150, 1300)
    def answer() -> str:
        return _text(rng, int(min(cap, max(3, rng.lognormvariate(0, 0.8) * median))))
    return [{"instruction": _text(rng, rng.randint(15, 60) if not tiny else 6), "input": "",
             "chosen": answer(), "rejected": answer()} for _ in range(n)]


def build_assets(work: Path, tiny: bool) -> tuple[Path, Path]:
    """A model folder (random weights, byte-level BPE tokenizer with a ChatML template) and
    a data folder with the pairs; reused when present."""
    model_dir, data_dir = work / "model", work / "data"
    if not (data_dir / "dataset_info.json").is_file():
        data_dir.mkdir(parents=True, exist_ok=True)
        pairs = build_pairs(64 if tiny else 4000, 7, tiny)
        (data_dir / "pairs.json").write_text(json.dumps(pairs))
        (data_dir / "dataset_info.json").write_text(json.dumps(
            {"pairs": {"file_name": "pairs.json", "ranking": True}}))
    if not (model_dir / "config.json").is_file():
        _save_model(model_dir, tiny)
    return model_dir, data_dir


def _save_model(folder: Path, tiny: bool) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, Qwen2Config

    sys.path.insert(0, str(SRC))
    from tunesmith.benchmarks.workloads import SHAPES

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([" ".join(WORDS)] * 50, trainers.BpeTrainer(
        vocab_size=400, special_tokens=specials, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>")
    fast.chat_template = (
        "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + "
        "'<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}"
        "{{ '<|im_start|>assistant\n' }}{% endif %}")
    shape = dict(SHAPES["tiny" if tiny else "qwen2.5-7b"])
    cfg = Qwen2Config(**shape, pad_token_id=fast.pad_token_id, eos_token_id=fast.eos_token_id)
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16 if device == "cuda"
                                                 else torch.float32)
    model.save_pretrained(folder)
    fast.save_pretrained(folder)


def common_keys(model_dir: Path, data_dir: Path, dataset: str, template: str, out: Path,
                steps: int, tiny: bool) -> dict:
    return {"model_name_or_path": str(model_dir), "template": template, "stage": "dpo",
            "finetuning_type": "lora", "lora_rank": 16, "lora_alpha": 32, "lora_target": "all",
            "pref_beta": 0.1, "pref_loss": "sigmoid", "dataset": dataset,
            "dataset_dir": str(data_dir), "cutoff_len": 256 if tiny else 2048,
            "output_dir": str(out), "overwrite_output_dir": True,
            "per_device_train_batch_size": 2, "per_device_eval_batch_size": 2,
            "gradient_accumulation_steps": 1, "learning_rate": 1e-5,
            "lr_scheduler_type": "constant", "max_steps": steps, "logging_steps": 1,
            "save_steps": 0, "bf16": not tiny, "gradient_checkpointing": "false",
            "preprocessing_num_workers": 1 if tiny else 8, "seed": 42, "plot_loss": False}


def run_tunesmith(name: str, keys: dict, work: Path, timeout: int) -> dict:
    """One `tunesmith train` run; steady-state figures from its metrics.jsonl."""
    import yaml

    path = work / f"tunesmith-{name}.yaml"
    path.write_text(yaml.safe_dump(keys))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get(
        "PYTHONPATH", "")])}
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "tunesmith", "train", str(path)], env=env,
                          capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - start
    (work / f"tunesmith-{name}.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        return {"system": f"tunesmith {name}", "error": proc.stderr.strip()[-600:],
                "wall_s": round(wall, 1)}
    recs = [json.loads(x) for x in (Path(keys["output_dir"]) / "metrics.jsonl").read_text()
            .splitlines()]
    last = [r for r in recs if "tokens_per_s" in r][-1]
    summary = json.loads((Path(keys["output_dir"]) / "run_summary.json").read_text())
    return {"system": f"tunesmith {name}", "tokens_per_s": last["tokens_per_s"],
            "peak_alloc_gb": last["peak_mem_gb"],
            "peak_reserved_gb": summary.get("performance", {}).get("peak_reserved_gb"),
            "first_loss": recs[0].get("loss"), "final_loss": last["loss"],
            "accuracy": last.get("rewards/accuracies"), "wall_s": round(wall, 1),
            "packing_efficiency": summary.get("data", {}).get("packing_efficiency")}


def run_peers(peers: Path, work: Path, out: Path, timeout: int) -> list[dict]:
    """LLaMA-Factory 0.9.5 + Liger DPO through the peers recipe (it builds the assets)."""
    env = {**os.environ, "PEERS_LF_STAGE": "dpo", "PEERS_ONLY": "llamafactory+liger",
           "PEERS_LENGTHS": "lognormal", "PEERS_NO_GC": "1", "PEERS_MICRO_BATCH": "2",
           "PEERS_WORK": str(work), "OUT": str(out)}
    env.pop("PYTHONPATH", None)
    subprocess.run(["bash", str(peers / "run_peers.sh"), "7b"], env=env, timeout=timeout,
                   check=False)
    path = out / "results.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.is_file() else []


def write_report(out: Path, command: str, rows: list[dict]) -> None:
    (out / "dpo.json").write_text(json.dumps({"command": command, "results": rows}, indent=1))
    lines = ["# DPO benchmark (LoRA r16, all projections, 2 pairs per micro-batch, no "
             "recompute)", "", f"command: `{command}`", "",
             "| system | tokens/s (chosen+rejected) | peak alloc GB | first loss | final loss "
             "| wall s | note |", "|---|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        tps = r.get("tokens_per_s") or r.get("tok_per_s") or 0.0
        mem = r.get("peak_alloc_gb") or r.get("peak_allocated_gb") or 0.0
        lines.append(f"| {r.get('system') or r.get('peer')} | {tps:,.0f} | {mem:.1f} | "
                     f"{r.get('first_loss')} | {r.get('final_loss')} | {r.get('wall_s')} | "
                     f"{(r.get('error') or '')[:120]} |")
    (out / "dpo.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "bench-dpo-out"))
    ap.add_argument("--work", default=str(ROOT / ".bench" / "dpo"))
    ap.add_argument("--tiny", action="store_true", help="CPU: tiny shapes, a few steps")
    ap.add_argument("--peers", default="", help="folder of the peers recipe (LLaMA-Factory)")
    ap.add_argument("--skip-lf", action="store_true",
                    help="with --peers: reuse the assets of an earlier peers run, skip LF")
    ap.add_argument("--configs", default=",".join(CONFIGS), help="tunesmith configs to run")
    ap.add_argument("--steps", type=int, default=0, help="steps per run (default 25; tiny 4)")
    ap.add_argument("--timeout", type=int, default=900)
    a = ap.parse_args()
    out, work = Path(a.out).resolve(), Path(a.work).resolve()
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    steps = a.steps or (4 if a.tiny else 25)
    rows: list[dict] = []
    if a.peers and not a.tiny:
        if not a.skip_lf:
            rows += run_peers(Path(a.peers).resolve(), work / "peers", out / "peers",
                              a.timeout)
        model_dir, data_dir = work / "peers" / "model_7b", work / "peers" / "data"
        dataset, template = "peers_pairs", "qwen"
    else:
        model_dir, data_dir = build_assets(work, a.tiny)
        dataset, template = "pairs", ""
    for name in [c for c in a.configs.split(",") if c]:
        if name not in CONFIGS:
            raise SystemExit(f"--configs: {name!r} is not one of {', '.join(CONFIGS)}")
        keys = {**common_keys(model_dir, data_dir, dataset, template, work / f"out-{name}",
                              steps, a.tiny), **CONFIGS[name]}
        if a.tiny:  # the CPU runs every path but the GPU-only kernels
            keys = {k: v for k, v in keys.items() if k not in GPU_ONLY}
        rows.append(run_tunesmith(name, keys, work, a.timeout))
        print(json.dumps(rows[-1]), flush=True)
    write_report(out, " ".join(["python", "bench/dpo.py", *sys.argv[1:]]),
                 remember(work / "results.jsonl", rows))
    return 0 if all("error" not in r for r in rows) else 1


def remember(path: Path, rows: list[dict]) -> list[dict]:
    """Results of this and earlier calls with the same --work (a device call has a time
    limit, so the configs may be measured over several calls); the latest per system."""
    with open(path, "a", encoding="utf-8") as fh:
        for r in rows:
            fh.write(json.dumps(r) + "\n")
    latest: dict[str, dict] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        r = json.loads(line)
        latest[str(r.get("system") or r.get("peer"))] = r
    return list(latest.values())


if __name__ == "__main__":
    raise SystemExit(main())
