"""Done-criterion of the vision path, through the CLI on the tiny Qwen2-VL: data with
images and a video -> train -> the adapter reloads to the engine's logits -> chat with an
image -> merged HF export with its processor reloads to the same logits; GGUF refused."""

from __future__ import annotations

import json

import pytest
import torch
import yaml

from tiny_vl import write_mm_dataset, write_video
from tunesmith.cli.main import main

pytestmark = pytest.mark.slow


def _image_inputs(engine, image):
    from tunesmith.infer.vision import encode_vision_prompt

    msgs = [{"role": "user", "content": "Who is this?", "images": [str(image)]}]
    ids, extra = encode_vision_prompt(msgs, engine.renderer, engine.tokenizer, engine.vision,
                                      engine.model)
    return {"input_ids": torch.tensor([ids]), **extra}


def _logits(model, inputs):
    with torch.no_grad():
        return model(**inputs).logits


def test_tiny_qwen2_vl_end_to_end(tmp_path, tiny_vl_dir, capsys, monkeypatch):
    from peft import PeftModel
    from transformers import AutoModelForImageTextToText

    from tunesmith.infer.engine import HFEngine

    monkeypatch.chdir(tmp_path)
    av = pytest.importorskip("av")  # noqa: F841 (the vision extra decodes the clip)
    data = tmp_path / "data"
    data.mkdir()
    write_mm_dataset(data, video=str(write_video(data / "clip.mp4").relative_to(data)))
    out, export = tmp_path / "out", tmp_path / "export"
    train = {"model_name_or_path": str(tiny_vl_dir), "dataset": "mm", "template": "qwen",
             "output_dir": str(out), "max_steps": 4, "learning_rate": 5e-2,
             "per_device_train_batch_size": 2, "save_steps": 0, "logging_steps": 1,
             "image_max_pixels": 100 * 100}
    (tmp_path / "train.yaml").write_text(yaml.safe_dump(train))
    assert main(["train", "train.yaml"]) == 0
    summary = json.loads((out / "run_summary.json").read_text())
    assert summary["data"]["samples"] == 4 and summary["data"]["bad_rows"] == 0
    assert (out / "preprocessor_config.json").is_file()
    from safetensors import safe_open

    with safe_open(out / "adapter_model.safetensors", "pt") as f:
        names = list(f.keys())
    assert names and not any("visual" in n for n in names)  # LoRA on the language model

    engine = HFEngine(str(tiny_vl_dir), [str(out)], device="cpu")
    inputs = _image_inputs(engine, data / "pics" / "a.png")
    base = AutoModelForImageTextToText.from_pretrained(tiny_vl_dir).eval()
    base_logits = _logits(base, inputs)
    reloaded = _logits(PeftModel.from_pretrained(base, str(out)).eval(), inputs)
    merged = _logits(engine.model, inputs)
    assert not torch.allclose(reloaded, base_logits, atol=1e-4)  # training changed it
    torch.testing.assert_close(reloaded, merged, rtol=1e-5, atol=1e-5)

    capsys.readouterr()
    assert main(["chat", "--model_name_or_path", str(tiny_vl_dir), "--adapter_name_or_path",
                 str(out), "--prompt", "Who is this?", "--image", "data/pics/a.png",
                 "--temperature", "0", "--max_new_tokens", "4", "--device", "cpu"]) == 0
    assert "assistant>" in capsys.readouterr().out

    exp = {"model_name_or_path": str(tiny_vl_dir), "adapter_name_or_path": str(out),
           "export_dir": str(export)}
    (tmp_path / "export.yaml").write_text(yaml.safe_dump(exp))
    assert main(["export", "export.yaml"]) == 0
    assert (export / "preprocessor_config.json").is_file()
    exported = AutoModelForImageTextToText.from_pretrained(export).eval()
    torch.testing.assert_close(_logits(exported, inputs), merged, rtol=1e-5, atol=1e-5)

    (tmp_path / "gguf.yaml").write_text(yaml.safe_dump(
        {**exp, "export_dir": str(tmp_path / "gguf"), "export_format": "gguf"}))
    capsys.readouterr()
    assert main(["export", "gguf.yaml"]) != 0
    assert "mmproj" in capsys.readouterr().err
