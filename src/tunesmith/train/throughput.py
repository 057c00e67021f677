"""Tokens/s, achieved FLOP/s, MFU, peak memory and time spent waiting for data."""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import torch

log = logging.getLogger(__name__)

# Dense bf16 matrix rate used as the MFU denominator (FLOP/s). H100/H200: the rate measured
# for an 8192^3 bf16 product on the lent H200 (790 TFLOP/s), not the datasheet's 989.
PEAK_BF16_FLOPS = {"H200": 790e12, "H100": 790e12, "A100": 312e12, "L40S": 362e12,
                   "A10G": 125e12, "RTX 4090": 165e12}


def device_peak_flops(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_BF16_FLOPS.items() if k in name), None)


class Throughput:
    """Running counters; `flops_for` maps a list of micro-batches to their FLOPs."""

    def __init__(self, device: torch.device, flops_for: Callable[[list], float] | None = None):
        self.device = device
        self.flops_for = flops_for
        self.tokens = self.trained = 0
        self.flops = 0.0
        self.data_wait = 0.0
        self._recent: deque[tuple[float, int, int, float]] = deque(maxlen=20)
        self.peak = device_peak_flops(device)
        self._told_no_mfu = False  # FLOP/s; None: unknown (CPU, unlisted GPU)
        self.steps: list[tuple[float, int, int, float]] = []  # (seconds, tokens, trained, flops)
        self._last = time.perf_counter()
        self.first_step_end: float | None = None  # perf_counter() when step 1 ended
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)

    def start(self) -> None:
        """The loop starts now: the first step's duration counts from here."""
        self._last = time.perf_counter()

    def add_data_wait(self, seconds: float) -> None:
        self.data_wait += seconds

    def add_step(self, micro: list[Any]) -> None:
        tokens = sum(b.n_tokens for b in micro)
        trained = sum(b.n_targets for b in micro)
        self.tokens += tokens
        self.trained += trained
        flops = self.flops_for(micro) if self.flops_for is not None else 0.0
        self.flops += flops
        now = time.perf_counter()
        self.steps.append((now - self._last, tokens, trained, flops))
        self._last = now
        if self.first_step_end is None:
            self.first_step_end = now
        self._recent.append((now, tokens, trained, flops))

    def recent(self) -> dict[str, float]:
        """Rates over the last steps; "mfu" (this process's model FLOP/s over its device's
        peak) only when both the model's FLOPs and the peak are known."""
        r = self._recent
        if len(r) < 2:
            return {"tokens_per_s": 0.0, "trained_tokens_per_s": 0.0}
        dt = r[-1][0] - r[0][0]
        tokens = sum(x[1] for x in list(r)[1:])
        trained = sum(x[2] for x in list(r)[1:])
        out = {"tokens_per_s": tokens / dt, "trained_tokens_per_s": trained / dt}
        flops = sum(x[3] for x in list(r)[1:])
        if self.peak and flops > 0:
            out["mfu"] = flops / dt / self.peak
        elif not self._told_no_mfu:  # said once per run, not on every logged step
            self._told_no_mfu = True
            log.info("MFU is left out of metrics.jsonl: %s", self.mfu_missing_reason()
                     or "no FLOPs were counted in the last steps")
        return out

    def mfu_missing_reason(self) -> str | None:
        """Why step records carry no MFU (None: they do)."""
        if self.flops_for is None:
            return "the model's FLOPs per token are not counted for this run"
        if not self.peak:
            what = "a CPU" if self.device.type != "cuda" else torch.cuda.get_device_name(
                self.device)
            return (f"the peak FLOP/s of {what} is unknown (known GPUs: "
                    f"{', '.join(PEAK_BF16_FLOPS)})")
        return None

    def peak_memory_gb(self) -> float:
        if self.device.type == "cuda":
            return torch.cuda.max_memory_allocated(self.device) / 1e9
        try:
            import resource

            return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # KB -> GB
        except ImportError:  # pragma: no cover - non-POSIX
            return 0.0

    def summary(self, elapsed: float) -> dict[str, Any]:
        peak = self.peak
        achieved = self.flops / elapsed if elapsed > 0 else 0.0
        out = {"tokens": self.tokens, "trained_tokens": self.trained,
               "tokens_per_s": self.tokens / elapsed if elapsed else 0.0,
               "trained_tokens_per_s": self.trained / elapsed if elapsed else 0.0,
               "achieved_tflops": achieved / 1e12,
               "mfu": achieved / peak if peak else None,
               "peak_memory_gb": self.peak_memory_gb(),
               "peak_memory_kind": "GPU allocated" if self.device.type == "cuda"
               else "process RSS",
               "data_wait_share": self.data_wait / elapsed if elapsed else 0.0,
               "elapsed_s": elapsed}
        out.update(steady_state(self.steps, peak))
        if self.device.type == "cuda":
            out["peak_reserved_gb"] = torch.cuda.max_memory_reserved(self.device) / 1e9
        return out


def warmup_steps(durations: list[float]) -> int:
    """Leading steps that belong to warm-up: the first step (allocator, kernel selection,
    compilation) and any step in the first half slower than twice the median of the second
    half (recompilation for a new shape). At most all but one step."""
    n = len(durations)
    if n < 2:
        return 0
    tail = sorted(durations[n // 2:])
    median = tail[len(tail) // 2]
    warm = 1
    for i in range(1, (n + 1) // 2):
        if durations[i] > 2 * median:
            warm = i + 1
    return min(warm, n - 1)


def steady_state(steps: list[tuple[float, int, int, float]], peak: float | None
                 ) -> dict[str, Any]:
    """Rates over the steps after warm-up (see `warmup_steps`)."""
    if not steps:
        return {}
    durations = [s[0] for s in steps]
    warm = warmup_steps(durations)
    rest = steps[warm:]
    seconds = sum(s[0] for s in rest) or 1e-9
    flops = sum(s[3] for s in rest) / seconds
    ordered = sorted(s[0] for s in rest)
    return {"steady_tokens_per_s": sum(s[1] for s in rest) / seconds,
            "steady_trained_tokens_per_s": sum(s[2] for s in rest) / seconds,
            "steady_tflops": flops / 1e12, "steady_mfu": flops / peak if peak else None,
            "steady_steps": len(rest), "warmup_steps": warm,
            "warmup_s": sum(durations[:warm]), "median_step_s": ordered[len(ordered) // 2],
            "first_step_s": durations[0]}
