"""Tokens/s, achieved FLOP/s, MFU, peak memory and time spent waiting for data."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any

import torch

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
        self._recent: deque[tuple[float, int, int]] = deque(maxlen=20)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)

    def add_data_wait(self, seconds: float) -> None:
        self.data_wait += seconds

    def add_step(self, micro: list[Any]) -> None:
        tokens = sum(b.n_tokens for b in micro)
        trained = sum(b.n_targets for b in micro)
        self.tokens += tokens
        self.trained += trained
        if self.flops_for is not None:
            self.flops += self.flops_for(micro)
        self._recent.append((time.perf_counter(), tokens, trained))

    def recent(self) -> dict[str, float]:
        r = self._recent
        if len(r) < 2:
            return {"tokens_per_s": 0.0, "trained_tokens_per_s": 0.0}
        dt = r[-1][0] - r[0][0]
        tokens = sum(x[1] for x in list(r)[1:])
        trained = sum(x[2] for x in list(r)[1:])
        return {"tokens_per_s": tokens / dt, "trained_tokens_per_s": trained / dt}

    def peak_memory_gb(self) -> float:
        if self.device.type == "cuda":
            return torch.cuda.max_memory_allocated(self.device) / 1e9
        try:
            import resource

            return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # KB -> GB
        except ImportError:  # pragma: no cover - non-POSIX
            return 0.0

    def summary(self, elapsed: float) -> dict[str, Any]:
        peak = device_peak_flops(self.device)
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
        if self.device.type == "cuda":
            out["peak_reserved_gb"] = torch.cuda.max_memory_reserved(self.device) / 1e9
        return out
