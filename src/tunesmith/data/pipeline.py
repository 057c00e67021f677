"""Rows -> tokenised store on disk, in chunks, in parallel worker processes.

    main process: read rows lazily ──chunks of CHUNK_ROWS──> pool.imap (order kept)
    each worker:  convert -> check -> render -> tokenise (one batched call per chunk)
    main process: append each returned chunk to the StoreWriter, update the progress bar

Workers get the tokenizer and template once, when the pool starts. Memory holds a few
chunks at a time, whatever the dataset size.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from tunesmith.config.environment import single_thread_tokenizers
from tunesmith.data.conversation import Conversation, Message, check_conversation
from tunesmith.data.encode import EncodeOptions, EncodeStats, encode_conversations
from tunesmith.data.formats import CONVERTERS, FormatSpec, RowError, attach_media, convert_text
from tunesmith.data.preference import KTO_TAG, encode_preference, read_kto_tag
from tunesmith.data.readers import Row
from tunesmith.data.registry import detect_format
from tunesmith.data.rowchecks import empty_answer, text_problem
from tunesmith.data.store import SampleStore, StoreWriter, other_label, trained_codes
from tunesmith.data.template import ChatRenderer
from tunesmith.data.vision_tokens import load_media
from tunesmith.errors import DataError

CHUNK_ROWS = 1000
PARALLEL_MIN_ROWS = 4 * CHUNK_ROWS  # below this a pool costs more than it saves


@dataclass
class EncodeJob:
    """Everything a worker needs; sent once per worker process."""

    spec: FormatSpec
    opts: EncodeOptions
    template_name: str
    template_source: str
    tokenizer: Any
    dataset_vars: dict[str, Any] = field(default_factory=dict)
    vision: Any = None  # media.VisionSettings for a vision-language model, None: text only
    model_name: str = ""  # for messages
    renderer: Any = None  # a ready renderer (slot templates); else built from the source


@dataclass
class ChunkResult:
    ids: np.ndarray  # [n_tokens] int32
    trained: np.ndarray  # [n_tokens] uint8
    lengths: np.ndarray  # [n_samples] int64
    sources: list[str]
    bad_rows: list[tuple[str, str]]
    stats: EncodeStats
    rows: int
    media: list[Any] = field(default_factory=list)  # per sample: MediaItems or None
    label_eos: int | None = None  # efficient-EOS templates: the label of trained code 2


@dataclass
class PipelineResult:
    store: SampleStore
    rows: int
    bad_rows: list[tuple[str, str]]
    stats: EncodeStats


# One job per worker process, set by the pool initializer (the standard multiprocessing
# pattern: a worker's long-lived state cannot be passed with every task cheaply).
_WORKER_STATE: dict[str, Any] = {}


def _init_worker(job: EncodeJob, in_pool: bool = False) -> None:
    if in_pool:
        single_thread_tokenizers()
    _WORKER_STATE["job"] = job
    _WORKER_STATE["renderer"] = (None if job.opts.plain_text else job.renderer
                                 or ChatRenderer(job.template_name, job.template_source,
                                                 job.tokenizer))


def _encode_chunk_in_worker(rows: list[Row]) -> ChunkResult:
    return encode_chunk(rows, _WORKER_STATE["job"], _WORKER_STATE["renderer"])


def encode_chunk(rows: list[Row], job: EncodeJob, renderer: ChatRenderer | None) -> ChunkResult:
    """Convert, check and encode one chunk of rows; bad rows are returned, never raised."""
    convs: list[Conversation] = []
    bad: list[tuple[str, str]] = []
    for row, where in rows:
        conv = convert_row(row, where, job, bad)
        if conv is not None and (conv.images or conv.videos) and job.vision is None:
            bad.append((where, text_model_media_reason(conv, job.model_name)))
        elif conv is not None and job.vision is not None and not job.opts.plain_text:
            try:
                conv.extra["media"] = load_media(conv, job.vision)
                convs.append(conv)
            except RowError as exc:
                bad.append((where, str(exc)))
        elif conv is not None:
            convs.append(conv)
    encode = encode_preference if job.opts.preference else encode_conversations
    samples, sources, stats = encode(convs, renderer, job.tokenizer, job.opts)
    bad += stats.bad
    stats.bad = []
    lengths = np.array([len(s) for s in samples], dtype=np.int64)
    label_eos = None
    if samples:
        ids = np.concatenate([s.input_ids for s in samples])
        labels = np.concatenate([s.labels for s in samples])
        trained, label_eos = trained_codes(ids, labels), other_label(ids, labels)
    else:
        ids, trained = np.zeros(0, np.int32), np.zeros(0, np.uint8)
    return ChunkResult(ids, trained, lengths, sources, bad, stats, len(rows),
                       [s.media for s in samples], label_eos)


def text_model_media_reason(conv: Conversation, model_name: str) -> str:
    counts = ", ".join(f"{len(v)} {k}" for k, v in (("image(s)", conv.images),
                                                      ("video(s)", conv.videos)) if v)
    return (f"the row has {counts} but the model {model_name or ''} is text-only (no "
            "vision tower or image processor), so they would be dropped and <image> trained "
            "as text; use a vision-language model (Qwen2-VL, Qwen2.5-VL, Qwen3-VL) or remove "
            "the media columns from dataset_info.json")


def convert_row(row: Any, where: str, job: EncodeJob, bad: list[tuple[str, str]]
                ) -> Conversation | None:
    """One row -> a checked Conversation, or None with the reason appended to `bad`."""
    if isinstance(row, RowError):
        bad.append((where, str(row)))
        return None
    if not isinstance(row, dict):
        bad.append((where, f"row is {type(row).__name__}, expected an object"))
        return None
    spec = job.spec
    try:
        if job.opts.plain_text:
            conv = convert_text(row, spec)
        elif spec.formatting == "auto":
            fmt = detect_format(row)
            conv = CONVERTERS[fmt](row, FormatSpec(fmt))
        else:
            conv = CONVERTERS[spec.formatting](row, spec)
        if not job.opts.plain_text:
            attach_media(row, spec, conv)
        if KTO_TAG in spec.columns:
            conv.extra[KTO_TAG] = read_kto_tag(row, spec)
    except (RowError, DataError) as exc:
        bad.append((where, str(exc)))
        return None
    conv.source = where
    problem = check_conversation(conv) or text_problem(conv) or empty_answer(conv)
    if problem:
        bad.append((where, problem))
        return None
    return fill_placeholders(conv, job.dataset_vars)


_PLACEHOLDER = re.compile(r"\{\{\s*(\w+)\s*\}\}")


def fill_placeholders(conv: Conversation, values: dict[str, Any]) -> Conversation:
    if not values:
        return conv

    def sub(text: str) -> str:
        return _PLACEHOLDER.sub(lambda m: str(values.get(m.group(1), m.group(0))), text)

    conv.messages = [Message(m.role, sub(m.content), m.tool_calls) for m in conv.messages]
    return conv


def _chunks(rows: Iterable[Row], size: int) -> Iterator[list[Row]]:
    it = iter(rows)
    while chunk := list(islice(it, size)):
        yield chunk


def worker_count(requested: int) -> int:
    """`preprocessing_num_workers`; 0 picks the usable cores (at most 8)."""
    if requested > 0:
        return requested
    return max(1, min(8, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                      else (os.cpu_count() or 1)))


def run_pipeline(rows: Iterable[Row], job: EncodeJob, out: Path, *, workers: int,
                 total_rows: int | None = None, desc: str = "tokenise",
                 chunk_rows: int = CHUNK_ROWS) -> PipelineResult:
    """Encode every row into a store at `out` (written atomically)."""
    writer = StoreWriter(out, job.vision)
    result = PipelineResult(SampleStore.from_samples([]), 0, [], EncodeStats())
    bar = tqdm(total=total_rows, desc=desc, unit="row", dynamic_ncols=True,
               disable=total_rows is not None and total_rows < PARALLEL_MIN_ROWS)
    parallel = workers > 1 and (total_rows is None or total_rows >= PARALLEL_MIN_ROWS)
    pool = None
    try:
        if parallel:
            ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
            pool = ctx.Pool(workers, initializer=_init_worker, initargs=(job, True))
            results = pool.imap(_encode_chunk_in_worker, _chunks(rows, chunk_rows))
        else:
            _init_worker(job)
            results = map(_encode_chunk_in_worker, _chunks(rows, chunk_rows))
        for chunk in results:
            writer.append_arrays(chunk.ids, chunk.trained, chunk.lengths, chunk.sources,
                                 chunk.media)
            writer.label_eos = writer.label_eos if chunk.label_eos is None else chunk.label_eos
            result.rows += chunk.rows
            result.bad_rows += chunk.bad_rows
            result.stats.merge(chunk.stats)
            bar.update(chunk.rows)
    except BaseException:
        writer.abort()
        raise
    finally:
        bar.close()
        if pool is not None:
            pool.terminate()
        _WORKER_STATE.clear()
    result.store = writer.close()
    return result
