"""`tunesmith export` with LLaMA-Factory's merge_lora/qwen3_gptq.yaml: GPTQ keys are checked
before the merge, and a missing library is named."""

from __future__ import annotations

import json

import pytest
import yaml

from lf_examples import EXAMPLES
from tunesmith.cli.main import main
from tunesmith.config.export_quant_keys import ExportQuantConfig
from tunesmith.errors import ExportError
from tunesmith.export.gptq import calibration_texts, check_gptq


def _example(tmp_path, model, **changes):
    data = yaml.safe_load((EXAMPLES / "merge_lora/qwen3_gptq.yaml").read_text())
    calib = tmp_path / "c4_demo.jsonl"
    calib.write_text("\n".join(json.dumps({"text": f"text {i} " * 20}) for i in range(5)))
    data.update(model_name_or_path=str(model), template="", export_dir=str(tmp_path / "exp"),
                export_quantization_dataset=str(calib), **changes)
    path = tmp_path / "export.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_gptq_export_names_the_missing_library(tmp_path, tiny_llama_dir, capsys,
                                               monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "gptqmodel" else real(name, *a))
    assert main(["export", str(_example(tmp_path, tiny_llama_dir))]) != 0
    err = capsys.readouterr().err
    assert "export_quantization_bit: needs the gptqmodel" in err and "pip install" in err
    assert not (tmp_path / "exp").exists()  # stopped before the merge


def test_gptq_keys_are_checked(tmp_path):
    calib = tmp_path / "c.jsonl"
    calib.write_text('{"text": "a b c"}\n{"text": "d e"}\n')
    with pytest.raises(ExportError, match="not a GPTQ width"):
        check_gptq(ExportQuantConfig(5, str(calib)), "hf")
    with pytest.raises(ExportError, match="export_format: hf"):
        check_gptq(ExportQuantConfig(4, str(calib)), "gguf")
    with pytest.raises(ExportError, match="is not a file"):
        check_gptq(ExportQuantConfig(4, str(tmp_path / "none.jsonl")), "hf")
    assert sorted(calibration_texts(str(calib), 5)) == ["a b c", "d e"]
    assert len(calibration_texts(str(calib), 1)) == 1
    (tmp_path / "bad.jsonl").write_text('{"txt": 1}\n')
    with pytest.raises(ExportError, match="bad.jsonl:1"):
        calibration_texts(str(tmp_path / "bad.jsonl"), 3)
