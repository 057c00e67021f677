"""Tokenised samples on disk: flat arrays plus offsets, memory-mapped on reload.

    <folder>/input_ids.bin   int32 [N_tokens]   every sample's ids, back to back
    <folder>/trained.bin     uint8 [N_tokens]   1 where the token is a loss target, 2 where
                                                the target is label_eos instead of the token
    <folder>/label_eos.json  int                (only with 2s) the EOS id of efficient-EOS
                                                templates, which the prompt after an answer
                                                carries as the answer's last label
    <folder>/offsets.npy     int64 [N + 1]      sample i is [offsets[i], offsets[i+1])
    <folder>/sources.json    list[str]          "file:line" of every sample (for reports)

A writer appends chunk by chunk (memory stays bounded by one chunk, so data larger than
memory streams through), then publishes the folder with one atomic rename. Reloading
maps the files and builds nothing per sample, so 100k samples open in milliseconds.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tunesmith.data.encode import IGNORE_INDEX, EncodedSample
from tunesmith.data.media_store import MediaTable, MediaWriter
from tunesmith.data.relocate import RelocatedSources

IDS_FILE, TRAINED_FILE, OFFSETS_FILE, SOURCES_FILE, LABEL_EOS_FILE = (
    "input_ids.bin", "trained.bin", "offsets.npy", "sources.json", "label_eos.json")


def trained_codes(ids: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """labels -> uint8 codes: 0 ignored, 1 trained on the token, 2 trained on label_eos."""
    return np.where(labels == IGNORE_INDEX, 0, np.where(labels == ids, 1, 2)).astype(np.uint8)


def other_label(ids: np.ndarray, labels: np.ndarray) -> int | None:
    """The one label that differs from its token (efficient EOS), or None."""
    odd = labels[(labels != IGNORE_INDEX) & (labels != ids)]
    return int(odd[0]) if len(odd) else None


class SampleStore(Sequence[EncodedSample]):
    """A read-only sequence of encoded samples backed by (memory-mapped) flat arrays."""

    def __init__(self, ids: np.ndarray, trained: np.ndarray, offsets: np.ndarray,
                 sources: list[str] | None = None, media: MediaTable | None = None,
                 label_eos: int | None = None):
        self.ids, self.trained, self.offsets = ids, trained, offsets
        self.label_eos = label_eos
        self._sources = sources
        self.media = media  # vision-language stores: the samples' images and videos
        self.lengths = np.diff(offsets)  # [N] int64

    @classmethod
    def from_samples(cls, samples: list[EncodedSample], sources: list[str] | None = None
                     ) -> SampleStore:
        lengths = np.array([len(s) for s in samples], dtype=np.int64)
        offsets = np.zeros(len(samples) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        label_eos = None
        if samples:
            ids = np.concatenate([s.input_ids for s in samples]).astype(np.int32)
            labels = np.concatenate([s.labels for s in samples])
            trained = trained_codes(ids, labels)
            label_eos = other_label(ids, labels)
        else:
            ids, trained = np.zeros(0, np.int32), np.zeros(0, np.uint8)
        return cls(ids, trained, offsets, sources, MediaTable.from_samples(samples),
                   label_eos)

    @classmethod
    def open(cls, folder: Path) -> SampleStore:
        offsets = np.load(folder / OFFSETS_FILE)
        n_tokens = int(offsets[-1])
        ids = _map(folder / IDS_FILE, np.int32, n_tokens)
        trained = _map(folder / TRAINED_FILE, np.uint8, n_tokens)
        eos_file = folder / LABEL_EOS_FILE
        label_eos = json.loads(eos_file.read_text()) if eos_file.is_file() else None
        return cls(ids, trained, offsets, None if not (folder / SOURCES_FILE).exists()
                   else _LazySources(folder / SOURCES_FILE),  # type: ignore[arg-type]
                   MediaTable.open(folder), label_eos)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        lo, hi = int(self.offsets[i]), int(self.offsets[i + 1])
        ids = np.asarray(self.ids[lo:hi], dtype=np.int32)
        codes = self.trained[lo:hi]
        labels = np.where(codes != 0, ids, IGNORE_INDEX).astype(np.int32)
        if self.label_eos is not None:
            labels[codes == 2] = self.label_eos
        if self.media is None:
            return EncodedSample(ids, labels)
        return EncodedSample(ids, labels, self.media.items(int(i)), self.media.vision)

    def source(self, i: int) -> str:
        return self._sources[i] if self._sources is not None else f"sample {i}"

    def relocate_sources(self, moved: dict[str, str]) -> None:
        """Sample locations name these moved files' new paths (data/relocate.py)."""
        if moved and self._sources is not None:
            self._sources = RelocatedSources(self._sources, moved)  # type: ignore[assignment]

    def save(self, folder: Path) -> None:
        writer = StoreWriter(folder, self.media.vision if self.media else None)
        media = [self.media.items(i) for i in range(len(self))] if self.media else None
        writer.label_eos = self.label_eos
        writer.append_arrays(np.asarray(self.ids), np.asarray(self.trained), self.lengths,
                             [self.source(i) for i in range(len(self))], media)
        writer.close()


def _map(path: Path, dtype: type, count: int) -> np.ndarray:
    if count == 0:
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r", shape=(count,))


class _LazySources:
    """Sample locations, read from disk only when a report needs one."""

    def __init__(self, path: Path):
        self.path, self._items = path, None

    def __getitem__(self, i: int) -> str:
        if self._items is None:
            self._items = json.loads(self.path.read_text(encoding="utf-8"))
        return self._items[i]


class StoreWriter:
    """Append encoded chunks to a temporary folder; `close` renames it into place."""

    def __init__(self, folder: Path, vision: Any = None):
        self.folder = folder
        self.tmp = folder.with_name(f".{folder.name}.tmp-{os.getpid()}")
        shutil.rmtree(self.tmp, ignore_errors=True)
        self.tmp.mkdir(parents=True)
        self._ids = open(self.tmp / IDS_FILE, "wb")  # noqa: SIM115 (closed in close())
        self._trained = open(self.tmp / TRAINED_FILE, "wb")  # noqa: SIM115
        self._lengths: list[np.ndarray] = []
        self._sources: list[str] = []
        self._media = MediaWriter(self.tmp, vision) if vision is not None else None
        self.label_eos: int | None = None  # set when trained holds 2s

    def append_arrays(self, ids: np.ndarray, trained: np.ndarray, lengths: np.ndarray,
                      sources: list[str], media: list[Any] | None = None) -> None:
        """ids/trained: [sum(lengths)] flat; lengths: [n]; sources: n locations; media: n
        lists of MediaItems (or None) for a vision-language store."""
        if self._media is not None:
            first = len(self._sources)
            for k, items in enumerate(media or []):
                self._media.append(first + k, items)
        self._ids.write(np.ascontiguousarray(ids, dtype=np.int32).tobytes())
        self._trained.write(np.ascontiguousarray(trained, dtype=np.uint8).tobytes())
        self._lengths.append(np.asarray(lengths, dtype=np.int64))
        self._sources += sources

    def close(self) -> SampleStore:
        self._ids.close()
        self._trained.close()
        if self._media is not None:
            self._media.close()
        lengths = np.concatenate(self._lengths) if self._lengths else np.zeros(0, np.int64)
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        np.save(self.tmp / OFFSETS_FILE, offsets)
        (self.tmp / SOURCES_FILE).write_text(json.dumps(self._sources), encoding="utf-8")
        if self.label_eos is not None:
            (self.tmp / LABEL_EOS_FILE).write_text(json.dumps(self.label_eos))
        if self.folder.exists():
            shutil.rmtree(self.folder)
        self.folder.parent.mkdir(parents=True, exist_ok=True)
        os.replace(self.tmp, self.folder)
        return SampleStore.open(self.folder)

    def abort(self) -> None:
        for fh in (self._ids, self._trained):
            fh.close()
        if self._media is not None:
            self._media.abort()
        shutil.rmtree(self.tmp, ignore_errors=True)


class IndexedSamples(Sequence[EncodedSample]):
    """A view that picks samples from several stores: item k is stores[which[k]][index[k]].
    Mixing, sub-sampling and the validation split are all such views (no copies)."""

    def __init__(self, stores: list[SampleStore], which: np.ndarray, index: np.ndarray):
        self.stores, self.which, self.index = stores, which, index
        self.lengths = np.zeros(len(index), dtype=np.int64)
        for d, store in enumerate(stores):
            sel = which == d
            self.lengths[sel] = store.lengths[index[sel]]

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, k):  # type: ignore[override]
        if isinstance(k, slice):
            return [self[j] for j in range(*k.indices(len(self)))]
        return self.stores[int(self.which[k])][int(self.index[k])]

    def source(self, k: int) -> str:
        return self.stores[int(self.which[k])].source(int(self.index[k]))

    def select(self, positions: np.ndarray) -> IndexedSamples:
        return IndexedSamples(self.stores, self.which[positions], self.index[positions])
