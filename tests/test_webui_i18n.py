"""The web UI's languages, hardware section, presets and template proposal, without a
browser (the browser tests drive the same parts in Chromium)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tunesmith.config.loader import build_config
from tunesmith.config.schema import field_index
from tunesmith.errors import ConfigError
from tunesmith.webui import i18n
from tunesmith.webui.hardware import Hardware, check_hardware, hardware_settings
from tunesmith.webui.jobs import command_text
from tunesmith.webui.model_hint import propose_template
from tunesmith.webui.monitor import RunView, figures_text, progress_text
from tunesmith.webui.presets import PRESETS, preset_values
from tunesmith.webui.workspace import Workspace

ROOT = Path(__file__).parents[1]
WEBUI = ROOT / "src" / "tunesmith" / "webui"


@pytest.fixture
def ws(tmp_path) -> Workspace:
    return Workspace.create(tmp_path / "work")


def _ids_in_code() -> set[str]:
    """Every text id the web UI's code names, dynamic ones expanded."""
    src = "\n".join(p.read_text() for p in WEBUI.glob("*.py") if p.name != "i18n.py")
    ids = set(re.findall(r'"@([a-z_.]+)"', src))
    ids |= set(re.findall(r"""(?<![\w])text\(["']([a-z_.]+)["']""", src))
    for section in ("model", "data", "finetuning", "training", "export", "eval"):
        ids |= {f"section.{section}", f"section.{section}.advanced"}
    ids |= {f"train.missing.{k}" for k in ("model_name_or_path", "dataset", "output_dir")}
    ids |= {f"train.template_hint.{w}" for w in ("own", "model_type", "none")}
    ids |= {f"status.{s}" for s in ("running", "finished", "stopped", "failed", "ended")}
    return ids


def test_every_text_and_config_key_has_english_and_chinese():
    assert i18n.missing_translations() == []
    unknown = sorted(_ids_in_code() - set(i18n.ui_strings()))
    assert unknown == [], f"ids used in the web UI without a text: {unknown}"
    for key in field_index():
        assert i18n.field_help(key, "zh") != i18n.field_help(key, "en"), key


def test_a_missing_chinese_help_is_reported(monkeypatch):
    table = dict(i18n.field_help_zh())
    del table["lora_rank"]
    monkeypatch.setattr(i18n, "field_help_zh", lambda: table)
    assert i18n.missing_translations() == ["field:lora_rank"]


def test_translator_switches_every_bound_text():
    import gradio as gr

    tr = i18n.Translator()
    with gr.Blocks():
        button = tr(gr.Button, value="@train.start")
        box = tr(gr.Number, 1, label="lora_rank", info="@field:lora_rank")
        plain = tr(gr.Textbox, label="output_dir")
    assert button.value == "Start" and box.info == "LoRA rank r."
    assert tr.components() == [button, box] and plain not in tr.components()
    zh = tr.updates("zh")
    assert zh[0]["value"] == "开始" and zh[1]["info"] == "LoRA 秩 r。"
    assert tr.updates("fr")[0]["value"] == "Start"  # unknown language: English


def test_messages_follow_the_language():
    view = RunView(step=3, total_steps=10, elapsed_s=5, eta_s=12, stopped_at=3)
    assert progress_text(view, "stopped", "zh").startswith("stopped: step 3/10")
    assert "已用" in progress_text(view, "stopped", "zh")
    assert "elapsed" in progress_text(view, "stopped", "en")
    assert "单卡显存峰值" in figures_text(RunView(mfu=0.512), "zh")
    assert "51.2%" in figures_text(RunView(mfu=0.512), "en")


def test_hardware_section_becomes_keys_and_environment(ws):
    keys, env = hardware_settings(Hardware(processes=2, strategy="ddp", ddp_backend="gloo"), ws)
    assert keys == {"ddp_backend": "gloo"} and env == {"NPROC_PER_NODE": "2"}
    keys, env = hardware_settings(Hardware(processes=4, devices="0, 1,2,3", strategy="fsdp2",
                                           fsdp_sharding="hybrid_shard", offload=True), ws)
    assert keys == {"fsdp": ["hybrid_shard", "offload"]}
    assert env == {"NPROC_PER_NODE": "4", "CUDA_VISIBLE_DEVICES": "0,1,2,3"}
    keys, _ = hardware_settings(Hardware(processes=2, strategy="deepspeed",
                                         deepspeed_stage=3, offload=True), ws)
    written = ws.root / keys["deepspeed"]
    example = ROOT / "examples" / "deepspeed" / "ds_z3_offload_config.json"
    assert json.loads(written.read_text()) == json.loads(example.read_text())
    cfg = build_config({"deepspeed": (keys["deepspeed"], "web form"),
                        "fsdp": (["full_shard", "offload"], "web form")})
    assert cfg.training.fsdp == ["full_shard", "offload"]


def test_packaged_deepspeed_configs_equal_the_examples():
    packaged = ROOT / "src" / "tunesmith" / "resources" / "deepspeed"
    names = sorted(p.name for p in (ROOT / "examples" / "deepspeed").glob("*.json"))
    assert names == sorted(p.name for p in packaged.glob("*.json"))
    for name in names:
        assert (packaged / name).read_text() == (ROOT / "examples" / "deepspeed" / name
                                                 ).read_text(), name


def test_bad_hardware_is_refused_with_every_problem(ws):
    problems = check_hardware(Hardware(processes=2, devices="0;1", strategy="single"))
    assert len(problems) == 2 and "single-process" in problems[0] and "'0;1'" in problems[1]
    with pytest.raises(ConfigError, match="offload with DeepSpeed needs ZeRO stage 3"):
        hardware_settings(Hardware(processes=2, strategy="deepspeed", deepspeed_stage=2,
                                   offload=True), ws)


def test_command_preview_shows_the_environment():
    assert command_text("train", "j/train.yaml", {"NPROC_PER_NODE": "2"}) == \
        "NPROC_PER_NODE=2 python -m tunesmith train j/train.yaml"


def test_presets_set_valid_speed_keys():
    keys = list(field_index())
    for name, values in PRESETS.items():
        raw = {k: (v, "preset") for k, v in values.items()}
        build_config(raw)  # every value is one the CLI accepts
        filled = preset_values(name, keys)
        assert {k: v for k, v in zip(keys, filled, strict=True) if v is not None} == values
    assert PRESETS["least_memory"]["gradient_checkpointing"] == "offload"
    assert PRESETS["fastest"]["gradient_checkpointing"] == "false"


def test_template_proposal(tmp_path, tiny_llama_dir):
    assert propose_template(tiny_llama_dir)[1] in ("own", "model_type", "none")
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    (bare / "tokenizer_config.json").write_text("{}")
    assert propose_template(bare) == ("qwen", "model_type")
    (bare / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{x}}"}))
    assert propose_template(bare) == ("", "own")
    (bare / "tokenizer_config.json").write_text("{}")
    (bare / "config.json").write_text(json.dumps({"model_type": "some_new_arch"}))
    assert propose_template(bare) == ("", "none")
