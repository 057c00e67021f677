"""Helpers for data-layer tests: write fixtures, run prepare_data with the tiny tokenizer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tunesmith.config.schema import DataConfig
from tunesmith.data.loading import DataContext, PreparedData, prepare_data
from tunesmith.data.template import ChatRenderer, load_template_source


def prepare(tokenizer, *, template: str = "chatml", stage: str = "sft",
            overwrite_cache: bool = False, **keys: Any) -> PreparedData:
    keys.setdefault("preprocessing_num_workers", 1)
    cfg = DataConfig(**keys)
    name, source = load_template_source(template, tokenizer)
    ctx = DataContext(ChatRenderer(name, source, tokenizer), tokenizer, 42, stage,
                      overwrite_cache)
    return prepare_data(cfg, ctx)


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows),
                    encoding="utf-8")
    return path


def alpaca_rows(n: int, start: int = 0) -> list[dict[str, str]]:
    return [{"instruction": f"Question {i}: what is {i} + {i}?", "input": "",
             "output": f"The answer is {2 * i}."} for i in range(start, start + n)]


def decoded_samples(tokenizer, data: PreparedData) -> list[str]:
    return [tokenizer.decode(data.train[i].input_ids) for i in range(len(data.train))]
