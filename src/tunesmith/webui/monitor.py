"""What the Train tab shows about a run, read from its metrics.jsonl (and nothing else).

The trainer appends one JSON line per logged step (step, loss, lr, tokens_per_s,
peak_mem_gb, elapsed_s, eta_s, total_steps), eval lines (eval_loss) and a `stopped` line
on a graceful stop; the page re-reads the file on a timer. Step lines also carry "mfu" when
the device's peak is known, and the preference stages' metrics (REWARD_METRICS).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tunesmith.runs.folder import read_metrics
from tunesmith.webui.i18n import text

# what the dpo / kto / rm objectives write per step (train/objectives/pairwise.py); eval
# lines carry the same names prefixed "eval_" (the reward model's eval accuracy among them);
# ppo writes its mean reward-model score as "reward" and its KL to the reference as "kl"
REWARD_METRICS = ("rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies",
                  "kl", "reward")


@dataclass
class RunView:
    """The figures of a run at one moment."""

    step: int = 0
    total_steps: int = 0
    loss: float | None = None
    lr: float | None = None
    tokens_per_s: float | None = None
    mfu: float | None = None  # model FLOP utilisation (GPU runs that log it)
    peak_mem_gb: float | None = None
    elapsed_s: float | None = None
    eta_s: float | None = None
    eval_loss: float | None = None
    stopped_at: int | None = None
    curve: list[dict[str, Any]] = field(default_factory=list)  # step, loss, series
    rewards: list[dict[str, Any]] = field(default_factory=list)  # step, value, series


def read_run(output_dir: Path) -> RunView:
    """Summarise `output_dir/metrics.jsonl` (an empty view before the first step)."""
    view = RunView()
    for r in read_metrics(output_dir / "metrics.jsonl"):
        if r.get("stopped"):
            view.stopped_at = int(r["step"])
        elif "eval_loss" in r:
            view.eval_loss = float(r["eval_loss"])
            view.curve.append({"step": r["step"], "loss": view.eval_loss, "series": "eval"})
            _take_rewards(view, int(r["step"]), r, "eval_")
        elif "loss" in r:
            _take_step(view, r)
    return view


def _take_step(view: RunView, r: dict[str, Any]) -> None:
    view.step = int(r["step"])
    if view.stopped_at is not None and view.step > view.stopped_at:
        view.stopped_at = None  # the run was resumed past its stop
    view.total_steps = int(r.get("total_steps") or view.total_steps)
    view.loss = float(r["loss"])
    view.lr = r.get("lr")
    view.tokens_per_s = r.get("tokens_per_s")
    view.mfu = r.get("mfu")
    view.peak_mem_gb = r.get("peak_mem_gb")
    view.elapsed_s = r.get("elapsed_s")
    view.eta_s = r.get("eta_s")
    if math.isfinite(view.loss):
        view.curve.append({"step": view.step, "loss": view.loss, "series": "train"})
    _take_rewards(view, view.step, r, "")


def _take_rewards(view: RunView, step: int, r: dict[str, Any], prefix: str) -> None:
    for name in REWARD_METRICS:
        value = r.get(prefix + name)
        if isinstance(value, int | float) and math.isfinite(value):
            series = ("eval " if prefix else "") + name.removeprefix("rewards/")
            view.rewards.append({"step": step, "value": float(value), "series": series})


def format_duration(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "?"
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def progress_text(view: RunView, status: str, lang: str = "en") -> str:
    """One line: status, step k/N, percentage, elapsed, ETA. The status word and "step k/N"
    stay in English in every language: the browser tests and scripts read them."""
    if not view.total_steps:
        if status == "running":
            return f"running: {text('progress.loading', lang)}"
        return f"{status}: {text('progress.before_first_step', lang)}"
    pct = 100.0 * view.step / view.total_steps
    line = (f"{status}: step {view.step}/{view.total_steps} ({pct:.0f}%) · "
            + text("progress.times", lang, elapsed=format_duration(view.elapsed_s),
                   eta=format_duration(view.eta_s)))
    if view.stopped_at is not None and status != "running":
        line += " · " + text("progress.stopped_at", lang, step=view.stopped_at)
    return line


def figures_text(view: RunView, lang: str = "en") -> str:
    """Loss, learning rate, throughput, MFU and memory per GPU as a Markdown table row."""
    def num(value: Any, fmt: str) -> str:
        return format(value, fmt) if isinstance(value, int | float) else "–"

    head = text("figures.header", lang)
    return (f"{head}\n|---|---|---|---|---|---|\n"
            f"| {num(view.loss, '.4f')} | {num(view.eval_loss, '.4f')} | {num(view.lr, '.3g')} "
            f"| {num(view.tokens_per_s, '.0f')} | {num(view.mfu, '.1%')} "
            f"| {num(view.peak_mem_gb, '.2f')} GB |")
