"""`tunesmith eval`: loss/perplexity, predictions, and a small MMLU-format benchmark."""

from __future__ import annotations

import csv
import json
import math

import pytest
import torch

from tunesmith.cli.main import main
from tunesmith.config import load_config
from tunesmith.errors import ConfigError, DataError
from tunesmith.evaluation.benchmark import (
    build_messages,
    find_split_files,
    load_benchmark,
    read_questions,
)
from tunesmith.evaluation.metrics import score_predictions
from tunesmith.evaluation.runner import (
    evaluate_benchmark,
    letter_predictor,
    run_eval,
)
from tunesmith.infer.engine import GenerationParams, HFEngine

# subject -> (category, test answers)
SUBJECTS = {"astronomy": ("STEM", "AABC"), "virology": ("Other", "ADD")}


def write_mmlu(root, shots: int = 3):
    """task_dir/mmlu in MMLU's layout: dev/ and test/ CSVs without header, mapping.json."""
    for split in ("dev", "test"):
        (root / "mmlu" / split).mkdir(parents=True)
    mapping = {}
    for subject, (category, answers) in SUBJECTS.items():
        mapping[subject] = {"name": subject.title(), "category": category}
        for split, letters in (("dev", "BCD"[:shots]), ("test", answers)):
            with (root / "mmlu" / split / f"{subject}_{split}.csv").open("w", newline="") as f:
                w = csv.writer(f)
                for i, letter in enumerate(letters):
                    w.writerow([f"{subject} question {i}: what is {i} + {i}?", str(2 * i),
                                str(i), str(i + 1), "none", letter])
    (root / "mmlu" / "mapping.json").write_text(json.dumps(mapping))
    return root


@pytest.fixture(scope="module")
def engine(tiny_llama_dir) -> HFEngine:
    return HFEngine(str(tiny_llama_dir))


def _cfg(tiny_llama_dir, **keys):
    return load_config(overrides={"model_name_or_path": str(tiny_llama_dir), **keys})


def test_benchmark_accuracy_by_hand(tmp_path, tiny_llama_dir, engine):
    write_mmlu(tmp_path)
    cfg = _cfg(tiny_llama_dir, task="mmlu_test", task_dir=str(tmp_path), n_shot=2,
               save_dir=str(tmp_path / "out"), batch_size=2)
    results = evaluate_benchmark(cfg, engine, predictor=lambda batch: ["A"] * len(batch))
    assert results["subjects"]["astronomy"]["accuracy"] == pytest.approx(50.0)
    assert results["subjects"]["virology"]["accuracy"] == pytest.approx(100 / 3, abs=1e-3)
    assert results["categories"]["STEM"]["accuracy"] == pytest.approx(50.0)
    assert results["overall"] == {"accuracy": pytest.approx(300 / 7, abs=1e-3), "correct": 3,
                                  "count": 7}
    saved = json.loads((tmp_path / "out" / "results.json").read_text())
    assert saved["overall"]["correct"] == 3 and saved["predictions"]["virology"] == ["A"] * 3


def test_benchmark_with_the_model_matches_single_questions(tmp_path, tiny_llama_dir, engine):
    write_mmlu(tmp_path)
    cfg = _cfg(tiny_llama_dir, task="mmlu_test", task_dir=str(tmp_path), n_shot=2,
               batch_size=3)
    results = run_eval(cfg, engine)
    subjects = load_benchmark(str(tmp_path), "mmlu_test", 2)
    tok = engine.tokenizer
    letter_ids = [tok.encode(x, add_special_tokens=False)[-1] for x in "ABCD"]
    correct = 0
    for s in subjects:
        for q, got in zip(s.questions, results["predictions"][s.key], strict=True):
            ids = torch.tensor([engine.encode_chat(build_messages(s, q, "en"))])
            with torch.no_grad():
                logits = engine.model(ids).logits[0, -1, letter_ids]
            assert got == "ABCD"[int(logits.argmax())]
            correct += got == q.answer
    assert results["overall"]["correct"] == correct


def test_benchmark_prompt_and_layouts(tmp_path):
    write_mmlu(tmp_path)
    subjects = load_benchmark(str(tmp_path), "mmlu_test", 2)
    msgs = build_messages(subjects[0], subjects[0].questions[0], "en")
    assert [m["role"] for m in msgs] == ["user", "assistant"] * 2 + ["user"]
    assert "Astronomy" in msgs[0]["content"] and msgs[1]["content"] == "B"
    assert msgs[-1]["content"].endswith("Answer:")
    ceval = tmp_path / "ceval" / "val"
    ceval.mkdir(parents=True)
    (ceval / "law_val.csv").write_text("id,question,A,B,C,D,answer,explanation\n"
                                       "0,问题一,甲,乙,丙,丁,C,因为\n", encoding="utf-8")
    assert list(find_split_files(tmp_path / "ceval", "validation")) == ["law"]
    q = read_questions(ceval / "law_val.csv")[0]
    assert (q.question, q.options, q.answer) == ("问题一", ["甲", "乙", "丙", "丁"], "C")
    cmmlu = tmp_path / "cmmlu" / "test"
    cmmlu.mkdir(parents=True)
    (cmmlu / "arts.csv").write_text(",Question,A,B,C,D,Answer\n0,问,一,二,三,四,b\n",
                                    encoding="utf-8")
    assert read_questions(cmmlu / "arts.csv")[0].answer == "B"
    (cmmlu / "bad.csv").write_text("q,1,2,3,4,E\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"bad.csv:1: answer 'E'"):
        read_questions(cmmlu / "bad.csv")
    with pytest.raises(ConfigError, match="does not exist"):
        load_benchmark(str(tmp_path), "nothere_test", 0)
    with pytest.raises(ConfigError, match="NAME_SPLIT"):
        load_benchmark(str(tmp_path), "mmlu", 0)


def _reference_loss(engine, rows):
    """Token-weighted mean loss with transformers' own labels path."""
    tok, total, count = engine.tokenizer, 0.0, 0
    for row in rows:
        msgs = [{"role": "user", "content": row["instruction"]},
                {"role": "assistant", "content": row["output"]}]
        full = tok(tok.apply_chat_template(msgs, tokenize=False),
                   add_special_tokens=False)["input_ids"]
        prompt = tok(tok.apply_chat_template(msgs[:1], tokenize=False,
                                             add_generation_prompt=True),
                     add_special_tokens=False)["input_ids"]
        labels = [-100] * len(prompt) + full[len(prompt):]
        with torch.no_grad():
            out = engine.model(torch.tensor([full]), labels=torch.tensor([labels]))
        n = len(full) - len(prompt)
        total, count = total + float(out.loss) * n, count + n
    return total / count, count


def test_loss_and_perplexity_match_transformers(tmp_path, tiny_llama_dir, engine, alpaca_file):
    cfg = _cfg(tiny_llama_dir, eval_dataset=str(alpaca_file), max_samples=7,
               per_device_eval_batch_size=3, output_dir=str(tmp_path / "out"))
    results = run_eval(cfg, engine)
    rows = json.loads(alpaca_file.read_text())[:7]
    loss, tokens = _reference_loss(engine, rows)
    assert results["eval_tokens"] == tokens and results["eval_samples"] == 7
    assert results["eval_loss"] == pytest.approx(loss, rel=1e-4)
    assert results["perplexity"] == pytest.approx(math.exp(loss), rel=1e-4)
    assert json.loads((tmp_path / "out" / "eval_results.json").read_text()) == results


def test_predict_writes_predictions_and_scores(tmp_path, tiny_llama_dir, engine, alpaca_file):
    out = tmp_path / "pred"
    cfg = _cfg(tiny_llama_dir, eval_dataset=str(alpaca_file), max_samples=5,
               predict_with_generate=True, do_sample=False, max_new_tokens=8,
               per_device_eval_batch_size=4, output_dir=str(out))
    results = run_eval(cfg, engine)
    lines = [json.loads(x) for x in (out / "generated_predictions.jsonl").read_text()
             .splitlines()]
    rows = json.loads(alpaca_file.read_text())[:5]
    assert [x["label"] for x in lines] == [r["output"] for r in rows]
    for line, row in zip(lines, rows, strict=True):
        msgs = [{"role": "user", "content": row["instruction"]}]
        assert line["predict"] == engine.generate(msgs, GenerationParams(8, temperature=0))
        assert line["prompt"] == engine.renderer.prompt_text(msgs)
    expected = score_predictions([x["predict"] for x in lines], [x["label"] for x in lines])
    saved = json.loads((out / "predict_results.json").read_text())
    assert {k: saved[k] for k in expected} == expected == {k: results[k] for k in expected}
    assert saved["predict_samples"] == 5


def test_eval_cli_runs_a_benchmark_yaml(tmp_path, tiny_llama_dir, capsys):
    write_mmlu(tmp_path)
    yaml = tmp_path / "eval.yaml"
    yaml.write_text(f"model_name_or_path: {tiny_llama_dir}\ntask: mmlu_test\n"
                    f"task_dir: {tmp_path}\nn_shot: 1\nlang: en\nbatch_size: 4\n"
                    f"save_dir: {tmp_path / 'res'}\n")
    assert main(["eval", str(yaml)]) == 0
    assert "eval (benchmark)" in capsys.readouterr().out
    assert json.loads((tmp_path / "res" / "results.json").read_text())["overall"]["count"] == 7
    assert main(["eval", str(yaml), "n_shot=-1"]) == 1
    assert "n_shot" in capsys.readouterr().err


def test_predict_needs_an_output_dir(tiny_llama_dir, alpaca_file):
    cfg = _cfg(tiny_llama_dir, eval_dataset=str(alpaca_file), predict_with_generate=True)
    with pytest.raises(ConfigError, match="output_dir"):
        run_eval(cfg)


def test_letter_predictor_batches_like_single_prompts(engine, tmp_path):
    write_mmlu(tmp_path)
    s = load_benchmark(str(tmp_path), "mmlu_test", 3)[0]
    prompts = [build_messages(s, q, "en") for q in s.questions]
    prompts[0] = build_messages(s.__class__(s.key, s.name, s.category, [], []),
                                s.questions[0], "en")  # a much shorter prompt: padding
    predict = letter_predictor(engine)
    assert predict(prompts) == [predict([p])[0] for p in prompts]


def test_fewshot_template_scores_the_spaced_letter(tiny_llama_dir, tmp_path):
    from tunesmith.evaluation.runner import answer_tokens

    plain = HFEngine(str(tiny_llama_dir), template="fewshot")
    text = plain.renderer.prompt_text([{"role": "user", "content": "Q1\nAnswer:"},
                                       {"role": "assistant", "content": "B"},
                                       {"role": "user", "content": "Q2\nAnswer:"}])
    assert text == "Q1\nAnswer: B\n\nQ2\nAnswer:"
    shared, ids = answer_tokens(plain)
    tok = plain.tokenizer
    assert [tok.decode(shared + [i]) for i in ids] == [" A", " B", " C", " D"]
    chat_shared, chat_ids = answer_tokens(HFEngine(str(tiny_llama_dir)))
    assert chat_shared == [] and [tok.decode([i]) for i in chat_ids] == list("ABCD")
    write_mmlu(tmp_path)
    cfg = _cfg(tiny_llama_dir, task="mmlu_test", task_dir=str(tmp_path), n_shot=2,
               template="fewshot")
    assert run_eval(cfg, plain)["overall"]["count"] == 7


def test_a_llama_factory_predict_yaml_runs(tmp_path, tiny_llama_dir, alpaca_file, capsys):
    yaml = tmp_path / "predict.yaml"
    yaml.write_text(f"""### model
model_name_or_path: {tiny_llama_dir}
trust_remote_code: false
### method
stage: sft
do_predict: true
finetuning_type: lora
### dataset
eval_dataset: {alpaca_file}
template: chatml
cutoff_len: 256
max_samples: 3
overwrite_cache: true
preprocessing_num_workers: 1
### output
output_dir: {tmp_path / 'predict'}
overwrite_output_dir: true
report_to: none
### eval
per_device_eval_batch_size: 2
predict_with_generate: true
do_sample: false
max_new_tokens: 4
ddp_timeout: 180000000
""")
    assert main(["eval", str(yaml)]) == 0
    assert "predict_bleu-4" in capsys.readouterr().out
    lines = (tmp_path / "predict" / "generated_predictions.jsonl").read_text().splitlines()
    assert len(lines) == 3
