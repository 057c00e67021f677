"""metrics.jsonl (one line per logged step), loss.png, and optional tensorboard/wandb."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from tunesmith.distributed.context import all_reduce_sum
from tunesmith.errors import ConfigError
from tunesmith.runs.folder import read_metrics
from tunesmith.runs.storage import disk_guard

log = logging.getLogger(__name__)


class MetricsLog:
    """Appends one JSON object per logged step; flushed at once so a watcher (the web UI)
    or a crash never sees a partial history."""

    def __init__(self, path: Path, report_to: str = "none", run_dir: Path | None = None,
                 logging_dir: str = "", run_name: str = ""):
        self.path = path
        _drop_torn_tail(path)
        self._fh = open(path, "ab")  # noqa: SIM115 (closed in close())
        self._sink = _open_sink(report_to, run_dir or path.parent, logging_dir, run_name)

    def write(self, record: dict[str, Any]) -> None:
        line = (json.dumps(record, default=float) + "\n").encode("utf-8")
        end = self._fh.tell()
        with disk_guard(self.path, "the metrics log", "its last record was not kept"):
            try:
                self._fh.write(line)
                self._fh.flush()
            except OSError:  # a record is whole or absent: cut a partial one off again
                self._fh.truncate(end)
                raise
        if self._sink is not None:
            self._sink(record)

    def close(self) -> None:
        self._fh.close()
        if self._sink is not None:
            getattr(self._sink, "close", lambda: None)()


def _drop_torn_tail(path: Path) -> None:
    """A run killed mid-write leaves a last line without its newline; appending after it
    would glue the next record to it, so it is cut off (and said) before appending."""
    if not path.is_file() or path.stat().st_size == 0:
        return
    with open(path, "rb+") as fh:
        data = fh.read()
        if data.endswith(b"\n"):
            return
        keep = data.rfind(b"\n") + 1
        fh.truncate(keep)
    log.warning("%s: dropped a partial last record (%d bytes) left by an interrupted run",
                path, len(data) - keep)


def _open_sink(report_to: str, run_dir: Path, logging_dir: str = "", run_name: str = ""):
    """tensorboard events go to logging_dir (default run_dir/runs); wandb names the run
    run_name (default: wandb's own)."""
    if report_to == "tensorboard":
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise ConfigError("report_to: tensorboard is not installed; pip install "
                              "'tunesmith[tensorboard]' or set report_to: none") from None
        writer = SummaryWriter(logging_dir or str(run_dir / "runs"))

        def tb(record: dict[str, Any]) -> None:
            for k, v in record.items():
                if isinstance(v, int | float) and k != "step":
                    writer.add_scalar(k, v, record["step"])
            writer.flush()
        tb.close = writer.close  # type: ignore[attr-defined]
        return tb
    if report_to == "wandb":
        try:
            import wandb
        except ImportError:
            raise ConfigError("report_to: wandb is not installed; pip install "
                              "'tunesmith[wandb]' or set report_to: none") from None
        run = wandb.init(dir=str(run_dir), name=run_name or None)

        def wb(record: dict[str, Any]) -> None:
            run.log(record, step=record["step"])
        wb.close = run.finish  # type: ignore[attr-defined]  # summary and files written
        return wb
    return None


def plot_loss(metrics_path: Path, out_png: Path) -> Path | None:
    """Draw training (and validation) loss against the optimizer step."""
    records = read_metrics(metrics_path)
    train = [(r["step"], r["loss"]) for r in records if "loss" in r]
    val = [(r["step"], r["eval_loss"]) for r in records if "eval_loss" in r]
    if not train:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    ax.plot(*zip(*train, strict=True), label="train loss", color="#1f77b4")
    if len(train) >= 8:
        k = max(2, len(train) // 10)
        ys = [t[1] for t in train]
        smooth = [sum(ys[max(0, i - k + 1):i + 1]) / len(ys[max(0, i - k + 1):i + 1])
                  for i in range(len(ys))]
        ax.plot([t[0] for t in train], smooth, color="#ff7f0e", label=f"moving mean ({k})")
    if val:
        ax.plot(*zip(*val, strict=True), "o-", label="validation loss", color="#2ca02c")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss (per trained token)")
    ax.set_title(f"loss: {metrics_path.parent.name}")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out_png)
    plt.close(fig)
    return out_png


def objective_metrics(objective: Any, split: str, ctx: Any) -> dict[str, float]:
    """Means of the metrics an objective gathered since the last call (e.g. DPO's rewards
    and accuracy), summed over ranks; eval ones are prefixed `eval_`. Every rank calls."""
    drain = getattr(objective, "drain_metrics", None)
    if drain is None:
        return {}
    sums = drain(split)
    if getattr(ctx, "distributed", False):
        flat = all_reduce_sum([x for v in sums.values() for x in v], ctx)
        sums = {k: (flat[2 * i], flat[2 * i + 1]) for i, k in enumerate(sums)}
    prefix = "eval_" if split == "eval" else ""
    return {prefix + k: s / c for k, (s, c) in sums.items() if c}
