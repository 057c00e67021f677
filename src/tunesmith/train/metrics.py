"""metrics.jsonl (one line per logged step), loss.png, and optional tensorboard/wandb."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from tunesmith.errors import ConfigError
from tunesmith.runs.folder import read_metrics

log = logging.getLogger(__name__)


class MetricsLog:
    """Appends one JSON object per logged step; flushed at once so a watcher (the web UI)
    or a crash never sees a partial history."""

    def __init__(self, path: Path, report_to: str = "none", run_dir: Path | None = None):
        self.path = path
        self._fh = open(path, "a", encoding="utf-8")
        self._sink = _open_sink(report_to, run_dir or path.parent)

    def write(self, record: dict[str, Any]) -> None:
        self._fh.write(json.dumps(record, default=float) + "\n")
        self._fh.flush()
        if self._sink is not None:
            self._sink(record)

    def close(self) -> None:
        self._fh.close()
        if self._sink is not None:
            getattr(self._sink, "close", lambda: None)()


def _open_sink(report_to: str, run_dir: Path):
    if report_to == "tensorboard":
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise ConfigError("report_to: tensorboard is not installed; pip install "
                              "'tunesmith[tensorboard]' or set report_to: none") from None
        writer = SummaryWriter(str(run_dir / "runs"))

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
        run = wandb.init(dir=str(run_dir))

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
