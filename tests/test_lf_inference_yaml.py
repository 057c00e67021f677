"""`tunesmith chat CONFIG.yaml` takes LLaMA-Factory's examples/inference YAMLs."""

from __future__ import annotations

import re

import pytest

from lf_examples import write_run_yaml
from tunesmith.cli.main import main


def test_chat_answers_from_an_inference_yaml(tmp_path, tiny_llama_dir, capsys):
    path = write_run_yaml("inference/qwen3.yaml", str(tiny_llama_dir), "", tmp_path,
                          template="")
    text = path.read_text().replace("dataset: ''\n", "").replace(f"output_dir: {tmp_path}/out\n",
                                                                 "")
    path.write_text(text)
    assert main(["chat", str(path), "--prompt", "hi", "--max_new_tokens", "3",
                 "--seed", "0"]) == 0
    assert "assistant>" in capsys.readouterr().out


@pytest.mark.parametrize("backend", ["vllm", "sglang"])
def test_other_backends_stop_with_the_way_to_serve_them(tmp_path, tiny_llama_dir, backend,
                                                       capsys):
    path = tmp_path / "infer.yaml"
    path.write_text(f"model_name_or_path: {tiny_llama_dir}\ninfer_backend: {backend}\n")
    assert main(["chat", str(path), "--prompt", "hi"]) != 0
    assert re.search(f"infer_backend: {backend} is not run by tunesmith chat.*tunesmith api",
                     capsys.readouterr().err)


def test_an_unknown_key_in_a_chat_yaml_is_reported(tmp_path, tiny_llama_dir, capsys):
    path = tmp_path / "infer.yaml"
    path.write_text(f"model_name_or_path: {tiny_llama_dir}\ninfer_bakend: huggingface\n")
    assert main(["chat", str(path), "--prompt", "hi"]) != 0
    assert "did you mean infer_backend" in capsys.readouterr().err
