"""Build the training/validation samples for a run from the data config.

    dataset names -> entries -> per dataset: cache hit (memory-map) or pipeline (tokenise
    in parallel into the cache) -> bad-row policy -> num_samples -> mix -> val split

Nothing is dropped without being counted in the `DataReport`.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np

from tunesmith.config.environment import hub_offline
from tunesmith.config.schema import DataConfig
from tunesmith.data.cache import (
    dataset_cache_dir,
    dataset_cache_key,
    file_digest,
    tokenizer_digest,
)
from tunesmith.data.conversation import Conversation
from tunesmith.data.encode import EncodedSample, EncodeOptions, EncodeStats
from tunesmith.data.mixing import mix_plan, resample, validation_split
from tunesmith.data.packing import PackedSamples
from tunesmith.data.pipeline import EncodeJob, convert_row, run_pipeline, worker_count
from tunesmith.data.preference import (
    PREFERENCE_STAGES,
    PreferenceItem,
    PreferenceView,
    check_stage_data,
)
from tunesmith.data.readers import Row, read_hub_rows, read_rows
from tunesmith.data.registry import DatasetEntry, resolve_dataset
from tunesmith.data.relocate import location_map, relocate
from tunesmith.data.slot_renderer import SlotRenderer
from tunesmith.data.store import IndexedSamples, SampleStore
from tunesmith.data.template import ChatRenderer
from tunesmith.errors import DataError
from tunesmith.runs.storage import disk_guard

log = logging.getLogger(__name__)
MAX_SHOWN_BAD_ROWS = 20
REPORT_FILE = "report.json"


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
    cache_hits: int = 0
    cache_misses: int = 0
    preprocess_s: float = 0.0
    packing: dict[str, Any] = field(default_factory=dict)

    def bad_rows_text(self) -> str:
        shown = [f"  {b.where}: {b.reason}" for b in self.bad_rows[:MAX_SHOWN_BAD_ROWS]]
        more = len(self.bad_rows) - MAX_SHOWN_BAD_ROWS
        return "\n".join(shown + ([f"  ... and {more} more"] if more > 0 else []))

    def summary(self) -> dict[str, Any]:
        e = self.encode
        return {"rows": self.rows, "bad_rows": len(self.bad_rows), "samples": e.samples,
                "truncated_prompt": e.truncated_prompt,
                "truncated_response": e.truncated_response, "split_texts": e.split_texts,
                "dropped_too_long": len(e.dropped_too_long),
                "dropped_no_trained_tokens": len(e.no_trained_tokens),
                "dropped_vision_cut": len(e.dropped_vision_cut),
                "trained_tokens": e.trained_tokens, "total_tokens": e.total_tokens,
                "cache_hits": self.cache_hits, "cache_misses": self.cache_misses,
                "preprocess_s": round(self.preprocess_s, 3), **self.packing}

    def add(self, rows: int, bad: list[tuple[str, str]], stats: EncodeStats) -> None:
        self.rows += rows
        self.bad_rows += [BadRow(w, r) for w, r in bad]
        self.encode.merge(stats)


@dataclass
class PreparedData:
    train: Sequence[EncodedSample]
    val: Sequence[EncodedSample]
    report: DataReport


@dataclass
class DataContext:
    """What, besides the data keys, decides the tokens."""

    renderer: ChatRenderer | SlotRenderer | None
    tokenizer: Any
    seed: int = 42
    stage: str = "sft"
    overwrite_cache: bool = False
    vision: Any = None  # media.VisionSettings of a vision-language model; None: text only
    model_name: str = ""


def encode_options(cfg: DataConfig, stage: str) -> EncodeOptions:
    return EncodeOptions(cfg.cutoff_len, cfg.truncation, cfg.train_on_prompt, cfg.mask_history,
                         plain_text=stage == "pt", preference=stage in PREFERENCE_STAGES)


def check_stage(entry: DatasetEntry, stage: str) -> None:
    """Preference pairs, KTO examples and plain examples each belong to their own stages."""
    problem = check_stage_data(entry.name, entry.spec, stage)
    if problem:
        raise DataError(problem)


def load_dataset_store(entry: DatasetEntry, cfg: DataConfig, ctx: DataContext,
                       report: DataReport) -> SampleStore:
    """Tokenised samples of one dataset, from the cache or freshly encoded into it."""
    check_stage(entry, ctx.stage)
    opts = encode_options(cfg, ctx.stage)
    if ctx.vision is not None:
        v = ctx.vision.token_ids
        opts = replace(opts, vision_ids=(v["image"], v["video"], v["start"], v["end"]),
                       media_ids=(v["image"], v["video"]))
    renderer = ctx.renderer
    source = ("" if opts.plain_text or renderer is None
              else getattr(renderer, "cache_key", renderer.source))
    settings = {"spec": entry.spec.__dict__, "opts": opts.__dict__, "split": entry.split,
                "max_samples": cfg.max_samples, "vars": cfg.dataset_vars,
                "hub": [entry.hub_id, entry.subset],
                "vision": ctx.vision.cache_settings() if ctx.vision is not None else None}
    key = dataset_cache_key([file_digest(p) for p in entry.files], tokenizer_digest(ctx.tokenizer),
                            source, settings)
    folder = dataset_cache_dir(key)
    cached = None if ctx.overwrite_cache else _open_cached(entry, folder, report)
    if cached is not None:
        log.info("dataset %s: loaded tokenised samples from cache %s", entry.name, folder)
        return cached
    (folder / REPORT_FILE).unlink(missing_ok=True)  # the entry is incomplete until rewritten
    if renderer is None and not opts.plain_text:
        raise DataError("a chat template is needed to encode conversations")
    job = EncodeJob(entry.spec, opts, getattr(renderer, "name", ""), source, ctx.tokenizer,
                    dict(cfg.dataset_vars), ctx.vision, ctx.model_name,
                    renderer=renderer if hasattr(renderer, "cache_key") else None)
    start = time.perf_counter()
    with disk_guard(folder, "the tokenised-dataset cache", "the cache entry is left "
                    "incomplete and is never read; it is rebuilt on the next run"):
        result = run_pipeline(_entry_rows(entry, cfg), job, folder / "samples",
                              workers=worker_count(cfg.preprocessing_num_workers),
                              total_rows=_count_hint(entry, cfg), desc=f"tokenise {entry.name}",
                              chunk_rows=cfg.preprocessing_batch_size)
        write_report_atomically(folder / REPORT_FILE, json.dumps(
            {"rows": result.rows, "bad_rows": result.bad_rows,
             "stats": result.stats.to_dict(), "files": [str(p) for p in entry.files]}))
    report.preprocess_s += time.perf_counter() - start
    report.cache_misses += 1
    report.add(result.rows, result.bad_rows, result.stats)
    return result.store


def _open_cached(entry: DatasetEntry, folder: Path, report: DataReport
                 ) -> SampleStore | None:
    """The cached store of `folder` when its report (written last) is there and readable,
    with its locations rewritten to this run's files (the cache may have been filled from a
    copy of the same content elsewhere); a damaged entry is said and rebuilt."""
    if not (folder / REPORT_FILE).is_file():
        return None
    try:
        saved = json.loads((folder / REPORT_FILE).read_text(encoding="utf-8"))
        store = SampleStore.open(folder / "samples")
        stats = EncodeStats.from_dict(saved["stats"])
        moved = location_map(saved["files"], [str(p) for p in entry.files])
    except (OSError, ValueError, KeyError) as exc:
        log.warning("tokenised cache %s is damaged (%s); rebuilding it", folder, exc)
        return None
    stats.dropped_too_long = [relocate(w, moved) for w in stats.dropped_too_long]
    stats.no_trained_tokens = [relocate(w, moved) for w in stats.no_trained_tokens]
    report.add(saved["rows"], [(relocate(w, moved), r) for w, r in saved["bad_rows"]], stats)
    report.cache_hits += 1
    store.relocate_sources(moved)
    return store


def write_report_atomically(path: Path, text: str) -> None:
    """The report marks a cache entry complete, so it appears whole or not at all."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def load_conversations(entry: DatasetEntry, cfg: DataConfig, report: DataReport
                       ) -> list[Conversation]:
    """Rows of one dataset converted and checked but not tokenised (inspection, prediction);
    bad rows are counted in `report` with their place and reason."""
    job = EncodeJob(entry.spec, encode_options(cfg, "sft"), "", "", None,
                    dict(cfg.dataset_vars))
    bad: list[tuple[str, str]] = []
    convs: list[Conversation] = []
    rows = 0
    for row, where in _entry_rows(entry, cfg):
        rows += 1
        conv = convert_row(row, where, job, bad)
        if conv is not None:
            convs.append(conv)
    report.add(rows, bad, EncodeStats())
    return convs


def _entry_rows(entry: DatasetEntry, cfg: DataConfig) -> Iterator[Row]:
    if entry.hub_id:
        rows: Iterator[Row] = read_hub_rows(entry.hub_id, entry.subset, entry.split,
                                            cfg.streaming, hub_offline())
    else:
        rows = (r for path in entry.files for r in read_rows(path, entry.split))
    return islice(rows, cfg.max_samples) if cfg.max_samples else rows


def _count_hint(entry: DatasetEntry, cfg: DataConfig) -> int | None:
    """Row count for the progress bar when it is cheap to know (JSON lines), else None."""
    if entry.hub_id or cfg.streaming or any(p.suffix != ".jsonl" for p in entry.files):
        return cfg.max_samples or None
    with_lines = sum(_count_lines(p) for p in entry.files)
    return min(with_lines, cfg.max_samples) if cfg.max_samples else with_lines


def _count_lines(path: Path) -> int:
    with open(path, "rb") as fh:
        return sum(block.count(b"\n") for block in iter(lambda: fh.read(1 << 22), b""))


def _load_group(names: list[str], cfg: DataConfig, ctx: DataContext, report: DataReport,
                mix: bool) -> IndexedSamples:
    entries = [resolve_dataset(n, cfg.dataset_dir) for n in names]
    stores = [load_dataset_store(e, cfg, ctx, report) for e in entries]
    if ctx.stage in PREFERENCE_STAGES:  # items of two consecutive samples each
        stores = [PreferenceView(s, kto=ctx.stage == "kto") for s in stores]  # type: ignore[misc]
    picks = [resample(len(s), e.num_samples, ctx.seed + d) if e.num_samples
             else np.arange(len(s)) for d, (e, s) in enumerate(zip(entries, stores, strict=True))]
    strategy = cfg.mix_strategy if mix else "concat"
    which, pos = mix_plan([len(p) for p in picks], strategy, cfg.interleave_probs, ctx.seed)
    index = np.zeros(len(pos), np.int64)
    for d, p in enumerate(picks):
        index[which == d] = p[pos[which == d]]
    return IndexedSamples(stores, which, index)


def prepare_data(cfg: DataConfig, ctx: DataContext) -> PreparedData:
    """Read, convert, check, encode (or load from cache), mix and split every dataset."""
    if cfg.tokenized_path and ctx.stage in PREFERENCE_STAGES:
        raise DataError(f"tokenized_path: not supported yet with stage {ctx.stage} (preference "
                        "items); remove it (the tokenised cache is reused anyway)")
    if cfg.tokenized_path and (Path(cfg.tokenized_path) / "manifest.json").is_file() \
            and not ctx.overwrite_cache:
        return load_tokenized(Path(cfg.tokenized_path))
    if not cfg.dataset:
        raise DataError("dataset: no training dataset given; set dataset to a name in "
                        f"{cfg.dataset_dir}/dataset_info.json or a file path")
    report = DataReport()
    train = _load_group(cfg.dataset, cfg, ctx, report, mix=True)
    val = (_load_group(cfg.eval_dataset, cfg, ctx, report, mix=False)
           if cfg.eval_dataset else None)
    check_bad_rows(report, cfg.on_bad_row)
    _log_losses(report.encode)
    if len(train) == 0:
        raise DataError(f"no usable samples in dataset(s) {', '.join(cfg.dataset)}; see the "
                        "counts above")
    train_pos, val_pos = validation_split(len(train), cfg.val_size, ctx.seed)
    val_parts = [train.select(val_pos)] + ([val] if val is not None else [])
    prepared = PreparedData(train.select(train_pos), _concat_views(val_parts), report)
    if cfg.tokenized_path:
        save_tokenized(prepared, Path(cfg.tokenized_path))
    return prepared


def apply_packing(data: PreparedData, cfg: DataConfig) -> Sequence[Any]:
    """The training items: packed rows when `packing` (or `neat_packing`) is on, else the
    samples. Packing figures go into the report (and so into the run summary)."""
    if not (cfg.packing or cfg.neat_packing):
        return data.train
    lengths = getattr(data.train, "lengths", None)
    if lengths is None:
        lengths = np.array([len(s) for s in data.train], dtype=np.int64)
    # a preference item holds two completions of up to cutoff_len tokens each
    per_item = 2 if len(data.train) and isinstance(data.train[0], PreferenceItem) else 1
    packed = PackedSamples(data.train, lengths, per_item * cfg.cutoff_len)
    data.report.packing = packed.stats()
    log.info("packing: %d samples into %d rows of %d tokens (efficiency %.1f%%)",
             len(data.train), len(packed), packed.capacity, 100 * packed.efficiency())
    return packed


def _concat_views(views: list[IndexedSamples]) -> IndexedSamples:
    stores = [s for v in views for s in v.stores]
    shift = np.cumsum([0] + [len(v.stores) for v in views])
    which = np.concatenate([v.which + shift[i] for i, v in enumerate(views)])
    return IndexedSamples(stores, which, np.concatenate([v.index for v in views]))


def check_bad_rows(report: DataReport, policy: str) -> None:
    if not report.bad_rows:
        return
    text = report.bad_rows_text()
    if policy == "error":
        raise DataError(f"{len(report.bad_rows)} bad row(s); fix them or set on_bad_row: skip to "
                        f"leave them out:\n{text}")
    log.warning("skipped %d bad row(s) (on_bad_row: skip):\n%s", len(report.bad_rows), text)


def save_tokenized(data: PreparedData, folder: Path) -> None:
    """`tokenized_path`: the final train/val samples, reloadable without the source data."""
    for name, samples in (("train", data.train), ("val", data.val)):
        sources = [samples.source(i) for i in range(len(samples))]  # type: ignore[attr-defined]
        SampleStore.from_samples(list(samples), sources).save(folder / name)
    r = data.report
    (folder / "manifest.json").write_text(json.dumps(
        {"rows": r.rows, "bad_rows": [[b.where, b.reason] for b in r.bad_rows],
         "stats": r.encode.to_dict()}), encoding="utf-8")
    log.info("saved tokenised data to %s", folder)


def load_tokenized(folder: Path) -> PreparedData:
    saved = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    report = DataReport(cache_hits=1)
    report.add(saved["rows"], saved["bad_rows"], EncodeStats.from_dict(saved["stats"]))
    log.info("loaded tokenised data from tokenized_path %s (data keys are not re-read)", folder)
    return PreparedData(SampleStore.open(folder / "train"), SampleStore.open(folder / "val"),
                        report)


def _log_losses(stats: EncodeStats) -> None:
    if stats.dropped_too_long:
        log.warning("dropped %d sample(s) longer than cutoff_len (truncation: drop), first: %s",
                    len(stats.dropped_too_long), stats.dropped_too_long[0])
    if stats.no_trained_tokens:
        log.warning("dropped %d sample(s) with no trained token left, first: %s",
                    len(stats.no_trained_tokens), stats.no_trained_tokens[0])
    if stats.dropped_vision_cut:
        log.warning("dropped %d sample(s) whose cutoff_len fell inside an image or video (raise "
                    "cutoff_len or lower image_max_pixels), first: %s",
                    len(stats.dropped_vision_cut), stats.dropped_vision_cut[0])
    if stats.truncated_prompt or stats.truncated_response:
        log.warning("truncated to cutoff_len: %d prompt(s), %d response(s)",
                    stats.truncated_prompt, stats.truncated_response)
