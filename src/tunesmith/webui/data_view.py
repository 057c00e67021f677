"""The Data tab's figures: counts, token lengths and rendered samples with trained spans.

Everything goes through the data layer (registry -> rows -> conversations -> template ->
encoding), so the preview shows exactly what training would see. `inspect_dataset` is the
one entry point; once `tunesmith data inspect` exists it can take its figures from there.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tunesmith.config.schema import Config, DataConfig
from tunesmith.data.encode import IGNORE_INDEX, EncodeOptions, encode_conversations
from tunesmith.data.loading import DataReport, load_conversations
from tunesmith.data.preference import KTO_TAG
from tunesmith.data.readers import FILE_SUFFIXES as DATA_FILE_SUFFIXES
from tunesmith.data.registry import builtin_data_dir, resolve_dataset
from tunesmith.data.template import ChatRenderer, load_template_source
from tunesmith.models.loader import load_tokenizer
from tunesmith.models.processor import load_vision_settings
from tunesmith.models.provision import resolve_model_path
from tunesmith.webui.preview_rows import (
    Highlighted,
    MediaPreview,
    PairColumns,
    media_preview,
    pair_columns,
    row_pieces,
)


@dataclass
class DatasetView:
    figures: dict[str, Any]
    samples: list[Highlighted] = field(default_factory=list)
    bad_rows: str = ""
    media: MediaPreview = field(default_factory=MediaPreview)
    pairs: list[PairColumns] = field(default_factory=list)  # preference rows, two columns


def dataset_choices(data_dir: Path) -> list[str]:
    """Names of dataset_info.json in `data_dir`, built-in names, and loose data files."""
    names: list[str] = []
    for folder in (data_dir, builtin_data_dir()):
        info = folder / "dataset_info.json"
        if info.is_file():
            try:
                names += [n for n in json.loads(info.read_text(encoding="utf-8"))
                          if n not in names]
            except (json.JSONDecodeError, TypeError):
                pass  # reported when the dataset is used
    if data_dir.is_dir():
        names += sorted(f"{data_dir.name}/{p.name}" for p in data_dir.iterdir()
                        if p.suffix.lower() in DATA_FILE_SUFFIXES)
    return names


def inspect_dataset(dataset: str, data_cfg: DataConfig, model_name_or_path: str,
                    template: str, n_samples: int = 3, lang: str = "en") -> DatasetView:
    """Read `dataset` as training would and summarise it.

    Args:
        dataset: a name of dataset_info.json, a built-in name, or a file path.
        data_cfg: dataset_dir, cutoff_len, truncation and masking keys used for encoding.
        model_name_or_path: the model whose tokenizer (and chat template) to use.
        template: `template:` as in training (empty: the tokenizer's own).
        n_samples: how many rendered samples (and rows with media) to return.
        lang: the language of the headings inside samples and of the media messages.
    """
    model_path = resolve_model_path(model_name_or_path, None)
    tokenizer = load_tokenizer(model_path)
    name, source = load_template_source(template, tokenizer)
    renderer = ChatRenderer(name, source, tokenizer)
    report = DataReport()
    convs = load_conversations(resolve_dataset(dataset, data_cfg.dataset_dir), data_cfg, report)
    opts = EncodeOptions(data_cfg.cutoff_len, "drop" if data_cfg.truncation == "error"
                         else data_cfg.truncation, data_cfg.train_on_prompt,
                         data_cfg.mask_history)
    encoded, _, stats = encode_conversations(convs, renderer, tokenizer, opts)
    lengths = np.array([len(s) for s in encoded] or [0])
    trained = np.array([int((s.labels != IGNORE_INDEX).sum()) for s in encoded] or [0])
    figures = {"rows": report.rows, "bad_rows": len(report.bad_rows),
               "samples": stats.samples, "template": name,
               "tokens_total": int(lengths.sum()), "tokens_trained": int(trained.sum()),
               "length_min": int(lengths.min()), "length_p50": int(np.percentile(lengths, 50)),
               "length_p95": int(np.percentile(lengths, 95)), "length_max": int(lengths.max()),
               "cutoff_len": data_cfg.cutoff_len,
               "truncated_prompt": stats.truncated_prompt,
               "truncated_response": stats.truncated_response,
               "over_cutoff": len(stats.dropped_too_long),
               "no_trained_tokens": len(stats.no_trained_tokens)}
    figures["rows_with_media"] = sum(1 for c in convs if c.images or c.videos)
    figures.update(_kind_counts(convs))
    samples = [row_pieces(renderer, c, opts, lang) for c in convs[:n_samples]]
    media = MediaPreview()
    if figures["rows_with_media"]:
        vision = load_vision_settings(str(model_path), tokenizer, Config(data=data_cfg))
        media = media_preview(convs, vision, renderer, tokenizer, opts, n_samples, lang)
    pairs = [pair_columns(renderer, c, opts) for c in convs[:n_samples]
             if c.rejected is not None]
    return DatasetView(figures, samples, report.bad_rows_text(), media, pairs)


def _kind_counts(convs: list[Any]) -> dict[str, int]:
    """Preference pairs and KTO labels among the rows (nothing for plain rows)."""
    out = {}
    pairs = sum(1 for c in convs if c.rejected is not None)
    if pairs:
        out["preference_pairs"] = pairs
    labels = [bool(c.extra[KTO_TAG]) for c in convs if KTO_TAG in c.extra]
    if labels:
        out["kto_desirable"], out["kto_undesirable"] = sum(labels), len(labels) - sum(labels)
    return out
