"""`tunesmith train` with LLaMA-Factory's extras/nlg_eval/llama3_lora_predict.yaml: no
training data, do_predict + predict_with_generate -> predictions scored like `tunesmith
eval` (LLaMA-Factory runs the same YAML through its train command)."""

from __future__ import annotations

import json

from lf_examples import write_run_yaml
from tunesmith.cli.main import main


def test_predict_yaml_through_train(tmp_path, tiny_llama_dir, alpaca_file):
    from tiny import build_model
    from tunesmith.adapters.setup import prepare_trainable
    from tunesmith.config.schema import FinetuningConfig

    adapter = tmp_path / "adapter"
    prepare_trainable(build_model(), FinetuningConfig(lora_rank=4), []).save_pretrained(adapter)
    path = write_run_yaml("extras/nlg_eval/llama3_lora_predict.yaml", str(tiny_llama_dir), "",
                          tmp_path, template="", adapter_name_or_path=str(adapter),
                          eval_dataset=str(alpaca_file), max_samples=3, max_new_tokens=4,
                          preprocessing_num_workers=1, dataloader_num_workers=0)
    data = path.read_text().replace("dataset: ''\n", "")
    path.write_text(data)
    assert main(["train", str(path)]) == 0
    rows = (tmp_path / "out/generated_predictions.jsonl").read_text().splitlines()
    assert len(rows) == 3
    assert "predict_bleu-4" in json.loads((tmp_path / "out/predict_results.json").read_text())
