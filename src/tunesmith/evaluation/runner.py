"""`tunesmith eval cfg.yaml`: one of three measurements of a (tuned) model.

- `task` set: a multiple-choice benchmark -> save_dir/results.json
- `predict_with_generate` (or `do_predict`): generate for every prompt of the dataset ->
  output_dir/generated_predictions.jsonl + predict_results.json (BLEU-4, ROUGE-1/2/L)
- otherwise: loss and perplexity on the dataset -> output_dir/eval_results.json

The dataset is `eval_dataset` when set, else `dataset`. Model, adapters and template load
as for chat (the adapter's saved template wins), so evaluation sees what training saw.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from pathlib import Path
from typing import Any

import torch

from tunesmith.config.schema import Config
from tunesmith.data.batching import collate
from tunesmith.data.loading import DataContext, DataReport, load_conversations, prepare_data
from tunesmith.data.registry import resolve_dataset
from tunesmith.errors import ConfigError, DataError
from tunesmith.evaluation.benchmark import LETTERS, Predictor, load_benchmark, run_benchmark
from tunesmith.evaluation.metrics import score_predictions
from tunesmith.infer.engine import GenerationParams, HFEngine
from tunesmith.models.processor import load_vision_settings
from tunesmith.train.objective import NextTokenObjective

log = logging.getLogger(__name__)


def eval_mode(cfg: Config) -> str:
    """benchmark | predict | loss, from the keys set."""
    if cfg.eval.task:
        return "benchmark"
    if cfg.eval.predict_with_generate or cfg.eval.do_predict:
        return "predict"
    return "loss"


def run_eval(cfg: Config, engine: HFEngine | None = None) -> dict[str, Any]:
    """Run the evaluation the config asks for; returns (and writes) its results."""
    mode = eval_mode(cfg)
    m = cfg.model
    if not m.model_name_or_path and engine is None:
        raise ConfigError("model_name_or_path: not set; name the base model to evaluate")
    if mode == "predict" and not cfg.training.output_dir:
        raise ConfigError("output_dir: not set; predictions are written to "
                          "output_dir/generated_predictions.jsonl")
    if engine is None:
        engine = HFEngine(m.model_name_or_path, m.adapter_name_or_path, m.template,
                          cfg.training.device, m.trust_remote_code, m.cache_dir or None)
    if mode == "benchmark":
        return evaluate_benchmark(cfg, engine)
    if mode == "predict":
        return evaluate_predictions(cfg, engine)
    return evaluate_loss(cfg, engine)


def _dataset_names(cfg: Config) -> list[str]:
    names = cfg.data.eval_dataset or cfg.data.dataset
    if not names:
        raise ConfigError("eval_dataset: not set (nor dataset); name the data to evaluate on")
    return names


def _write_json(folder: str, name: str, results: dict[str, Any]) -> None:
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        (Path(folder) / name).write_text(json.dumps(results, indent=2, ensure_ascii=False),
                                         encoding="utf-8")


def evaluate_loss(cfg: Config, engine: HFEngine) -> dict[str, Any]:
    """Token-weighted mean next-token loss on the trained tokens of every sample, and
    perplexity = exp(loss), with the training objective and data pipeline."""
    data_cfg = dataclasses.replace(cfg.data, dataset=_dataset_names(cfg), eval_dataset=[],
                                   val_size=0.0)
    vision = load_vision_settings(engine.model_path, engine.tokenizer, cfg)
    samples = prepare_data(data_cfg, DataContext(engine.renderer, engine.tokenizer,
                                                 cfg.training.seed, vision=vision,
                                                 model_name=engine.model_path)).train
    t = cfg.training
    objective = NextTokenObjective(t.loss_impl, t.loss_chunk_size)
    loss_sum, tokens = 0.0, 0
    bs = t.per_device_eval_batch_size
    for i in range(0, len(samples), bs):
        batch = collate(samples[i:i + bs], engine.tokenizer.pad_token_id).to(engine.device)
        with torch.inference_mode():
            loss_sum += float(objective.loss_sum(engine.model, batch).float())
        tokens += batch.n_targets
    loss = loss_sum / tokens
    results = {"eval_loss": round(loss, 6), "perplexity": round(math.exp(min(loss, 700)), 6),
               "eval_samples": len(samples), "eval_tokens": tokens}
    _write_json(t.output_dir, "eval_results.json", results)
    return results


@dataclasses.dataclass
class PromptItem:
    messages: list[dict[str, Any]]
    label: str
    where: str


def read_prompt_items(cfg: Config) -> list[PromptItem]:
    """Every conversation of the dataset, split into the prompt (all turns before the last
    assistant turn) and the reference (that turn)."""
    report = DataReport()
    convs = []
    for name in _dataset_names(cfg):
        convs += load_conversations(resolve_dataset(name, cfg.data.dataset_dir), cfg.data,
                                    report)
    if report.bad_rows and cfg.data.on_bad_row == "error":
        raise DataError(f"{len(report.bad_rows)} bad row(s); fix them or set on_bad_row: skip "
                        f"to leave them out:\n{report.bad_rows_text()}")
    items = []
    for conv in convs:
        msgs = conv.dicts()
        last = max(i for i, msg in enumerate(msgs) if msg["role"] == "assistant")
        items.append(PromptItem(msgs[:last], msgs[last]["content"], conv.source))
    if not items:
        raise DataError(f"no usable samples in {', '.join(_dataset_names(cfg))}")
    return items


def evaluate_predictions(cfg: Config, engine: HFEngine) -> dict[str, Any]:
    e, out = cfg.eval, Path(cfg.training.output_dir)
    items = read_prompt_items(cfg)
    params = GenerationParams(e.max_new_tokens, e.temperature if e.do_sample else 0.0, e.top_p,
                              e.top_k, e.repetition_penalty, seed=cfg.training.seed)
    out.mkdir(parents=True, exist_ok=True)
    preds, truncated, bs = [], 0, cfg.training.per_device_eval_batch_size
    cutoff = cfg.data.cutoff_len
    with (out / "generated_predictions.jsonl").open("w", encoding="utf-8") as f:
        for i in range(0, len(items), bs):
            chunk = items[i:i + bs]
            prompts = [engine.encode_chat(it.messages) for it in chunk]
            truncated += sum(len(p) > cutoff for p in prompts)
            done = engine.generate_batch([p[-cutoff:] for p in prompts], params)
            for it, r in zip(chunk, done, strict=True):
                preds.append(r.text)
                row = {"prompt": engine.renderer.prompt_text(it.messages), "predict": r.text,
                       "label": it.label}
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
    if truncated:
        log.warning("%d prompt(s) longer than cutoff_len %d were cut to their last %d tokens",
                    truncated, cutoff, cutoff)
    results = score_predictions(preds, [it.label for it in items]) | {
        "predict_samples": len(items), "truncated_prompts": truncated}
    _write_json(str(out), "predict_results.json", results)
    return results


def answer_tokens(engine: HFEngine) -> tuple[list[int], list[int]]:
    """How the answers "A".."D" begin under the engine's chat template, as (tokens all four
    share, the first token where they differ): "A" right after a chat template's assistant
    header; " A" (or " " then "A" in a small vocabulary) after "Answer:" in the plain
    few-shot template. Found by rendering a turn with and without the answer."""
    tok = engine.tokenizer
    probe = [{"role": "user", "content": "Question"}]
    prompt = engine.encode_chat(probe)
    answers = []
    for letter in LETTERS:
        text = engine.renderer.render_messages(probe + [{"role": "assistant",
                                                         "content": letter}])
        full = tok(text, add_special_tokens=False)["input_ids"]
        prefix_ok = full[:len(prompt)] == prompt and len(full) > len(prompt)
        answers.append(full[len(prompt):] if prefix_ok else
                       tok.encode(letter, add_special_tokens=False))
    shared = 0
    while all(len(a) > shared + 1 for a in answers) and len({a[shared] for a in answers}) == 1:
        shared += 1
    ids = [a[shared] for a in answers]
    if len(set(ids)) != len(LETTERS):
        raise DataError(f"the answers A-D cannot be told apart by one token under template "
                        f"{engine.renderer.name!r}; this model cannot be scored by letter")
    return answers[0][:shared], ids


def letter_predictor(engine: HFEngine) -> Predictor:
    """Answers a batch of question prompts with the letter whose token is likeliest next
    (one forward pass per batch, left padding, only the last position's logits)."""
    tok = engine.tokenizer
    shared, letter_ids = answer_tokens(engine)
    limit = engine.max_length

    def predict(batch: list[list[dict[str, str]]]) -> list[str]:
        prompts = [engine.encode_chat(m) + shared for m in batch]
        if limit and any(len(p) > limit for p in prompts):
            log.warning("benchmark prompt longer than the model's %d tokens: keeping its end; "
                        "lower n_shot", limit)
            prompts = [p[-limit:] for p in prompts]
        width = max(len(p) for p in prompts)
        pad = tok.pad_token_id
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts],
                           device=engine.device)  # [B, T]
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts],
                            device=engine.device)  # [B, T]
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        with torch.inference_mode():
            out = engine.model(input_ids=ids, attention_mask=mask, position_ids=positions,
                               use_cache=False, logits_to_keep=1)
        scores = out.logits[:, -1, letter_ids]  # [B, 4]
        return [LETTERS[i] for i in scores.argmax(-1).tolist()]

    return predict


def evaluate_benchmark(cfg: Config, engine: HFEngine,
                       predictor: Predictor | None = None) -> dict[str, Any]:
    e = cfg.eval
    subjects = load_benchmark(e.task_dir, e.task, e.n_shot)
    results = run_benchmark(subjects, predictor or letter_predictor(engine), e.lang,
                            e.batch_size)
    results = {"task": e.task, "n_shot": e.n_shot, "lang": e.lang} | results
    _write_json(e.save_dir or cfg.training.output_dir, "results.json", results)
    return results
