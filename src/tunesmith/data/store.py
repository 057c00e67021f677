"""Tokenised samples on disk: flat arrays plus offsets, memory-mapped on reload.

    <folder>/input_ids.bin   int32 [N_tokens]   every sample's ids, back to back
    <folder>/trained.bin     uint8 [N_tokens]   1 where the token is a loss target
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

import numpy as np

from tunesmith.data.encode import IGNORE_INDEX, EncodedSample
from tunesmith.data.relocate import RelocatedSources

IDS_FILE, TRAINED_FILE, OFFSETS_FILE, SOURCES_FILE = (
    "input_ids.bin", "trained.bin", "offsets.npy", "sources.json")


class SampleStore(Sequence[EncodedSample]):
    """A read-only sequence of encoded samples backed by (memory-mapped) flat arrays."""

    def __init__(self, ids: np.ndarray, trained: np.ndarray, offsets: np.ndarray,
                 sources: list[str] | None = None):
        self.ids, self.trained, self.offsets = ids, trained, offsets
        self._sources = sources
        self.lengths = np.diff(offsets)  # [N] int64

    @classmethod
    def from_samples(cls, samples: list[EncodedSample], sources: list[str] | None = None
                     ) -> SampleStore:
        lengths = np.array([len(s) for s in samples], dtype=np.int64)
        offsets = np.zeros(len(samples) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        if samples:
            ids = np.concatenate([s.input_ids for s in samples]).astype(np.int32)
            trained = np.concatenate([s.labels != IGNORE_INDEX for s in samples]).astype(np.uint8)
        else:
            ids, trained = np.zeros(0, np.int32), np.zeros(0, np.uint8)
        return cls(ids, trained, offsets, sources)

    @classmethod
    def open(cls, folder: Path) -> SampleStore:
        offsets = np.load(folder / OFFSETS_FILE)
        n_tokens = int(offsets[-1])
        ids = _map(folder / IDS_FILE, np.int32, n_tokens)
        trained = _map(folder / TRAINED_FILE, np.uint8, n_tokens)
        return cls(ids, trained, offsets, None if not (folder / SOURCES_FILE).exists()
                   else _LazySources(folder / SOURCES_FILE))  # type: ignore[arg-type]

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        lo, hi = int(self.offsets[i]), int(self.offsets[i + 1])
        ids = np.asarray(self.ids[lo:hi], dtype=np.int32)
        labels = np.where(self.trained[lo:hi] != 0, ids, IGNORE_INDEX).astype(np.int32)
        return EncodedSample(ids, labels)

    def source(self, i: int) -> str:
        return self._sources[i] if self._sources is not None else f"sample {i}"

    def relocate_sources(self, moved: dict[str, str]) -> None:
        """Sample locations name these moved files' new paths (data/relocate.py)."""
        if moved and self._sources is not None:
            self._sources = RelocatedSources(self._sources, moved)  # type: ignore[assignment]

    def save(self, folder: Path) -> None:
        writer = StoreWriter(folder)
        writer.append_arrays(np.asarray(self.ids), np.asarray(self.trained), self.lengths,
                             [self.source(i) for i in range(len(self))])
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

    def __init__(self, folder: Path):
        self.folder = folder
        self.tmp = folder.with_name(f".{folder.name}.tmp-{os.getpid()}")
        shutil.rmtree(self.tmp, ignore_errors=True)
        self.tmp.mkdir(parents=True)
        self._ids = open(self.tmp / IDS_FILE, "wb")  # noqa: SIM115 (closed in close())
        self._trained = open(self.tmp / TRAINED_FILE, "wb")  # noqa: SIM115
        self._lengths: list[np.ndarray] = []
        self._sources: list[str] = []

    def append_arrays(self, ids: np.ndarray, trained: np.ndarray, lengths: np.ndarray,
                      sources: list[str]) -> None:
        """ids/trained: [sum(lengths)] flat; lengths: [n]; sources: n locations."""
        self._ids.write(np.ascontiguousarray(ids, dtype=np.int32).tobytes())
        self._trained.write(np.ascontiguousarray(trained, dtype=np.uint8).tobytes())
        self._lengths.append(np.asarray(lengths, dtype=np.int64))
        self._sources += sources

    def close(self) -> SampleStore:
        self._ids.close()
        self._trained.close()
        lengths = np.concatenate(self._lengths) if self._lengths else np.zeros(0, np.int64)
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        np.save(self.tmp / OFFSETS_FILE, offsets)
        (self.tmp / SOURCES_FILE).write_text(json.dumps(self._sources), encoding="utf-8")
        if self.folder.exists():
            shutil.rmtree(self.folder)
        self.folder.parent.mkdir(parents=True, exist_ok=True)
        os.replace(self.tmp, self.folder)
        return SampleStore.open(self.folder)

    def abort(self) -> None:
        for fh in (self._ids, self._trained):
            fh.close()
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
