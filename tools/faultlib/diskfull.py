"""ENOSPC injected into the writes of the tokenised cache, an export and the metrics log:
each ends in a StorageError naming the path and the free space, and nothing half-written
is picked up by the next run."""

from __future__ import annotations

import errno
import json
from pathlib import Path
from typing import Any

from tunesmith.config.schema import DataConfig
from tunesmith.data import store as data_store
from tunesmith.data.loading import DataContext, prepare_data
from tunesmith.data.template import ChatRenderer, load_template_source
from tunesmith.errors import StorageError
from tunesmith.export.staging import staged_dir
from tunesmith.train.metrics import MetricsLog


def _enospc(path: object = "") -> OSError:
    return OSError(errno.ENOSPC, "No space left on device", str(path))


def _prepare(tokenizer: Any, data: Path) -> Any:
    name, source = load_template_source("chatml", tokenizer)
    ctx = DataContext(ChatRenderer(name, source, tokenizer), tokenizer, 42, "sft")
    return prepare_data(DataConfig(dataset=[str(data)], preprocessing_num_workers=1), ctx)


def _good_message(message: str, what: str) -> bool:
    return "disk full" in message and what in message and "free" in message


def disk_full_cache(work: Path, tokenizer: Any, count: int = 4) -> dict[str, Any]:
    """ENOSPC at the k-th step of writing a cache entry (data chunk, offsets, sources,
    report); then a normal run must rebuild the entry and get every sample."""
    good, notes = 0, []
    for k in range(count):
        data = work / f"cache-{k}.jsonl"
        data.write_text("".join(json.dumps({"instruction": f"q{k} {i}", "output": f"a {i}"})
                                + "\n" for i in range(30 + k)), encoding="utf-8")
        message = _fail_cache_write(tokenizer, data, k % 4)
        try:
            again = _prepare(tokenizer, data)
            rebuilt = len(again.train) == 30 + k and again.report.cache_misses == 1
        except Exception as exc:  # noqa: BLE001 (a crash here is the failure being counted)
            rebuilt, notes = False, notes + [f"rerun {k}: {exc!r}"]
        if _good_message(message, "tokenised-dataset cache") and rebuilt:
            good += 1
        else:
            notes.append(f"step {k}: {message!r} rebuilt={rebuilt}")
    return {"fault": "disk full while writing the tokenised cache", "count": count, "ok": good,
            "how": "ENOSPC in the data file, the offsets, the sources list or the report of a "
                   "new cache entry; then a normal run", "notes": notes[:5]}


def _fail_cache_write(tokenizer: Any, data: Path, where: int) -> str:
    """Prepare `data` with ENOSPC raised at step `where` of the cache write; the message."""
    import numpy as np

    from tunesmith.data import loading

    writer_cls = data_store.StoreWriter
    saved = (writer_cls.append_arrays, writer_cls.close, np.save,
             loading.write_report_atomically)
    append, close, save, report = _failing(saved, where)
    writer_cls.append_arrays, writer_cls.close = append, close  # type: ignore[method-assign]
    data_store.np.save, loading.write_report_atomically = save, report
    try:
        _prepare(tokenizer, data)
        return ""
    except StorageError as exc:
        return str(exc)
    finally:
        writer_cls.append_arrays, writer_cls.close = saved[0], saved[1]  # type: ignore[method-assign]
        data_store.np.save, loading.write_report_atomically = saved[2], saved[3]


def _failing(real: tuple[Any, ...], where: int) -> tuple[Any, ...]:
    """Wrappers of (append_arrays, close, np.save, write_report_atomically) raising ENOSPC
    in the one picked by `where`."""
    def append(self: Any, *a: Any) -> None:
        real[0](self, *a)
        if where == 0:
            raise _enospc(self.tmp)

    def close(self: Any) -> Any:
        if where == 2:
            self._ids.close()
            self._trained.close()
            raise _enospc(self.tmp / data_store.SOURCES_FILE)
        return real[1](self)

    def save(path: Any, *a: Any, **kw: Any) -> None:
        if where == 1:
            raise _enospc(path)
        real[2](path, *a, **kw)

    def report(path: Path, text: str) -> None:
        if where == 3:
            raise _enospc(path)
        real[3](path, text)
    return append, close, save, report


def disk_full_export(work: Path, count: int = 3) -> dict[str, Any]:
    """ENOSPC while an export writes its k-th file: export_dir is left as it was (absent,
    or the previous export) and no partial folder remains."""
    good, notes = 0, []
    for k in range(count):
        out = work / f"export-{k}"
        if k % 2:  # a previous export that must survive
            out.mkdir(parents=True)
            (out / "model.safetensors").write_text("previous")
        try:
            with staged_dir(out) as tmp:
                for i in range(k + 1):
                    (tmp / f"part-{i}.bin").write_bytes(b"x" * 1000)
                raise _enospc(tmp / f"part-{k}.bin")
        except StorageError as exc:
            message = str(exc)
        leftovers = [p.name for p in out.parent.glob(f".{out.name}.*")]
        intact = (out / "model.safetensors").read_text() == "previous" if k % 2 else (
            not out.exists())
        if _good_message(message, str(out)) and intact and not leftovers:
            good += 1
        else:
            notes.append(f"export {k}: {message!r} intact={intact} left={leftovers}")
    return {"fault": "disk full while exporting", "count": count, "ok": good,
            "how": "ENOSPC at the k-th file of an export (with and without a previous "
                   "export in export_dir)", "notes": notes[:5]}


class _FullFile:
    """A file object whose writes store half the bytes and then raise ENOSPC."""

    def __init__(self, fh: Any):
        self.fh = fh

    def write(self, data: bytes) -> int:
        self.fh.write(data[: len(data) // 2])
        self.fh.flush()
        raise _enospc(self.fh.name)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.fh, name)


def disk_full_metrics(work: Path, count: int = 3) -> dict[str, Any]:
    """ENOSPC in the middle of a metrics record: the record is cut off again, so the file
    holds whole lines only and a resumed run appends cleanly."""
    good, notes = 0, []
    for k in range(count):
        path = work / f"metrics-{k}.jsonl"
        log = MetricsLog(path)
        for step in range(k + 1):
            log.write({"step": step, "loss": 1.0})
        log._fh = _FullFile(log._fh)
        try:
            log.write({"step": 99, "loss": 2.0})
            message = ""
        except StorageError as exc:
            message = str(exc)
        log._fh = log._fh.fh
        log.close()
        MetricsLog(path).write({"step": 100, "loss": 3.0})  # the resumed run
        lines = path.read_text().splitlines()
        whole = [json.loads(x)["step"] for x in lines] == [*range(k + 1), 100]
        if _good_message(message, str(path)) and whole:
            good += 1
        else:
            notes.append(f"metrics {k}: {message!r} lines={lines}")
    return {"fault": "disk full while writing metrics", "count": count, "ok": good,
            "how": "ENOSPC after half of a metrics record was written", "notes": notes[:5]}
