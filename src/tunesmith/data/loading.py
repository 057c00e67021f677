"""Build the training/validation samples for a run from the data config."""

from __future__ import annotations

import logging
import random
import re
from dataclasses import dataclass, field
from typing import Any

from tunesmith.config.schema import DataConfig
from tunesmith.data.conversation import Conversation, Message, check_conversation
from tunesmith.data.encode import EncodedSample, EncodeOptions, EncodeStats, encode_conversations
from tunesmith.data.formats import CONVERTERS, FormatSpec, RowError
from tunesmith.data.readers import read_rows
from tunesmith.data.registry import DatasetEntry, detect_format, resolve_dataset
from tunesmith.data.template import ChatRenderer
from tunesmith.errors import DataError

log = logging.getLogger(__name__)
MAX_SHOWN_BAD_ROWS = 20


@dataclass
class BadRow:
    where: str
    reason: str


@dataclass
class DataReport:
    """What happened to every row: nothing is dropped without being counted here."""

    rows: int = 0
    bad_rows: list[BadRow] = field(default_factory=list)
    encode: EncodeStats = field(default_factory=EncodeStats)

    def bad_rows_text(self) -> str:
        shown = [f"  {b.where}: {b.reason}" for b in self.bad_rows[:MAX_SHOWN_BAD_ROWS]]
        more = len(self.bad_rows) - MAX_SHOWN_BAD_ROWS
        return "\n".join(shown + ([f"  ... and {more} more"] if more > 0 else []))

    def summary(self) -> dict[str, Any]:
        e = self.encode
        return {"rows": self.rows, "bad_rows": len(self.bad_rows), "samples": e.samples,
                "truncated_prompt": e.truncated_prompt,
                "truncated_response": e.truncated_response,
                "dropped_too_long": len(e.dropped_too_long),
                "dropped_no_trained_tokens": len(e.no_trained_tokens),
                "trained_tokens": e.trained_tokens, "total_tokens": e.total_tokens}


_PLACEHOLDER = re.compile(r"\{\{\s*(\w+)\s*\}\}")


def fill_placeholders(conv: Conversation, values: dict[str, Any]) -> Conversation:
    if not values:
        return conv

    def sub(text: str) -> str:
        return _PLACEHOLDER.sub(lambda m: str(values.get(m.group(1), m.group(0))), text)

    conv.messages = [Message(m.role, sub(m.content), m.tool_calls) for m in conv.messages]
    return conv


def load_conversations(entry: DatasetEntry, cfg: DataConfig, report: DataReport,
                       ) -> list[Conversation]:
    convs: list[Conversation] = []
    spec = entry.spec
    limit = cfg.max_samples or None
    for path in entry.files:
        for row, where in read_rows(path):
            if limit is not None and len(convs) >= limit:
                return convs
            report.rows += 1
            conv = _convert_row(row, where, spec, report)
            if conv is None:
                continue
            convs.append(fill_placeholders(conv, cfg.dataset_vars))
    return convs


def _convert_row(row: Any, where: str, spec: FormatSpec, report: DataReport
                 ) -> Conversation | None:
    if not isinstance(row, dict):
        report.bad_rows.append(BadRow(where, f"row is {type(row).__name__}, expected an object"))
        return None
    try:
        fmt = spec.formatting if spec.formatting != "auto" else detect_format(row)
        conv = CONVERTERS[fmt](row, spec if spec.formatting != "auto" else FormatSpec(fmt))
    except (RowError, DataError) as exc:
        report.bad_rows.append(BadRow(where, str(exc)))
        return None
    conv.source = where
    problem = check_conversation(conv)
    if problem:
        report.bad_rows.append(BadRow(where, problem))
        return None
    return conv


def split_validation(convs: list[Conversation], val_size: float, seed: int
                     ) -> tuple[list[Conversation], list[Conversation]]:
    if not val_size:
        return convs, []
    n_val = int(val_size) if val_size >= 1 else max(1, round(len(convs) * val_size))
    if n_val >= len(convs):
        raise DataError(f"val_size {val_size} leaves no training samples out of {len(convs)}")
    order = list(range(len(convs)))
    random.Random(seed).shuffle(order)
    val_idx = set(order[:n_val])
    return ([c for i, c in enumerate(convs) if i not in val_idx],
            [c for i, c in enumerate(convs) if i in val_idx])


@dataclass
class PreparedData:
    train: list[EncodedSample]
    val: list[EncodedSample]
    report: DataReport


def prepare_data(cfg: DataConfig, renderer: ChatRenderer, tokenizer: Any, seed: int,
                 ) -> PreparedData:
    """Read, convert, check, split and encode every dataset named in the config."""
    if not cfg.dataset:
        raise DataError("dataset: no training dataset given; set dataset to a name in "
                        f"{cfg.dataset_dir}/dataset_info.json or a file path")
    report = DataReport()
    convs: list[Conversation] = []
    for name in cfg.dataset:
        convs += load_conversations(resolve_dataset(name, cfg.dataset_dir), cfg, report)
    eval_convs: list[Conversation] = []
    for name in cfg.eval_dataset:
        eval_convs += load_conversations(resolve_dataset(name, cfg.dataset_dir), cfg, report)
    if report.bad_rows:
        text = report.bad_rows_text()
        if cfg.on_bad_row == "error":
            raise DataError(f"{len(report.bad_rows)} bad row(s); fix them or set on_bad_row: "
                            f"skip to leave them out:\n{text}")
        log.warning("skipping %d bad row(s) (on_bad_row: skip):\n%s", len(report.bad_rows),
                    text)
    if not convs:
        raise DataError(f"no usable samples in dataset(s) {', '.join(cfg.dataset)}")
    train_convs, val_convs = split_validation(convs, cfg.val_size, seed)
    val_convs += eval_convs
    opts = EncodeOptions(cfg.cutoff_len, cfg.truncation, cfg.train_on_prompt, cfg.mask_history)
    train, stats = encode_conversations(train_convs, renderer, tokenizer, opts)
    val, _ = encode_conversations(val_convs, renderer, tokenizer, opts) if val_convs else ([],
                                                                                           None)
    report.encode = stats
    _log_losses(stats)
    if not train:
        raise DataError("every sample was dropped during encoding (too long or nothing to "
                        "train on); see the counts above")
    return PreparedData(train, val, report)


def _log_losses(stats: EncodeStats) -> None:
    if stats.dropped_too_long:
        log.warning("dropped %d sample(s) longer than cutoff_len (truncation: drop), first: %s",
                    len(stats.dropped_too_long), stats.dropped_too_long[0])
    if stats.no_trained_tokens:
        log.warning("dropped %d sample(s) with no trained token left, first: %s",
                    len(stats.no_trained_tokens), stats.no_trained_tokens[0])
    if stats.truncated_prompt or stats.truncated_response:
        log.warning("truncated to cutoff_len: %d prompt(s), %d response(s)",
                    stats.truncated_prompt, stats.truncated_response)
