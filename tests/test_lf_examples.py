"""LLaMA-Factory's own example YAMLs: how many the config loader accepts unchanged (but for
the model and paths), and the reason given for each it refuses."""

from __future__ import annotations

import pytest

from lf_examples import EXAMPLES, example_files, substituted
from tunesmith.config.loader import build_config
from tunesmith.errors import ConfigError

# example -> why it is refused today. Other work (preference stages, vision, inference
# verbs) only shrinks this; a YAML refused for a reason not listed here fails the test.
EXPECTED_REFUSED = {
    "extras/mod/llama3_full_sft.yaml": "refused by tunesmith",  # mixture_of_depths
    "extras/multi_tokens/tokens_cfg.yaml": "is not a training config",  # a token file
    "extras/oft/qwen2_5vl_oft_sft.yaml": "not supported by tunesmith yet",
    "train_full/qwen3vl_full_sft.yaml": "not supported by tunesmith yet",
    "train_lora/mossvl_lora_sft.yaml": "not supported by tunesmith yet",
    "train_lora/qwen3_lora_dpo.yaml": "not supported by tunesmith yet",
    "train_lora/qwen3_lora_kto.yaml": "not supported by tunesmith yet",
    "train_lora/qwen3_lora_reward.yaml": "is not one of sft, pt",
    "train_lora/qwen3vl_lora_dpo.yaml": "not supported by tunesmith yet",
    "train_lora/qwen3vl_lora_sft.yaml": "not supported by tunesmith yet",
}


def walk(work) -> tuple[list[str], dict[str, str]]:
    accepted, refused = [], {}
    for path in example_files():
        name = path.relative_to(EXAMPLES).as_posix()
        try:
            build_config(substituted(path, "tiny-model", work))
            accepted.append(name)
        except ConfigError as exc:
            refused[name] = str(exc)
    return accepted, refused


def test_example_yamls_are_accepted_or_refused_with_a_reason(tmp_path, capsys):
    accepted, refused = walk(tmp_path)
    assert len(accepted) + len(refused) == 52
    with capsys.disabled():
        print(f"\nLLaMA-Factory examples accepted: {len(accepted)} of 52; refused:")
        for name, message in refused.items():
            print(f"  {name}: {message.splitlines()[1].strip()[:160]}")
    unexpected = sorted(set(refused) - set(EXPECTED_REFUSED))
    assert not unexpected, f"newly refused: {unexpected}: {[refused[n] for n in unexpected]}"
    for name, message in refused.items():
        assert EXPECTED_REFUSED[name] in message, (name, message)
    assert len(accepted) >= 52 - len(EXPECTED_REFUSED)


@pytest.mark.parametrize("key,value,reason", [
    ("mixture_of_depths", "convert", "replaces the model's classes"),
    ("use_unsloth", True, "patches transformers' classes"),
    ("use_kt", True, "KTransformers"),
    ("hf_hub_token", "x", "HF_TOKEN"),
])
def test_refused_keys_name_their_reason(key, value, reason):
    with pytest.raises(ConfigError, match=reason) as info:
        build_config({key: (value, "cfg.yaml:3")})
    assert "cfg.yaml:3" in str(info.value) and "refused" in str(info.value)


def test_key_table_is_current():
    """docs/llamafactory_keys.md is generated from the schema: implementing or refusing a
    key without regenerating it fails here (python tools/lf_keys_table.py)."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).parents[1]
    done = subprocess.run([sys.executable, "tools/lf_keys_table.py", "--check"], cwd=root,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_llamafactory_key_has_a_status_and_a_message():
    from tunesmith.config.lf_keys import key_status, llamafactory_keys

    keys = llamafactory_keys()
    assert len(keys) > 300
    for key in keys:
        status, note = key_status(key)
        if status == "implemented":
            continue
        with pytest.raises(ConfigError) as info:
            build_config({key: (1, "x.yaml:1")})
        text = str(info.value)
        assert ("refused by tunesmith" in text) if status == "refused" else (
            "not supported by tunesmith yet" in text), (key, text)


def test_project_method_examples_load():
    from pathlib import Path

    from tunesmith.config import load_config

    folder = Path(__file__).parents[1] / "examples" / "methods"
    loaded = {p.stem: load_config(p) for p in sorted(folder.glob("*.yaml"))}
    assert loaded["loraplus"].optim.loraplus_lr_ratio == 16.0
    assert loaded["qlora"].method.quantization_bit == 4
    assert loaded["muon"].optim.use_muon and loaded["dft"].method.use_dft_loss
    assert loaded["pissa"].method.pissa_convert and loaded["galore"].optim.use_galore
