"""Out-of-memory handling: automatic micro-batch back-off, and a message that says what
drives the peak and which setting to change instead of a bare CUDA traceback."""

from __future__ import annotations

import logging

import torch

from tunesmith.config.schema import TrainingConfig

log = logging.getLogger(__name__)


class MicroBatchSizer:
    """`auto_batch_size`: start with the whole optimizer step in one micro-batch and halve
    on out-of-memory (or when the peak passes `memory_threshold` of the device); the
    samples of a step never change, so results equal a run with the final size."""

    def __init__(self, step_samples: int, threshold: float, device: torch.device):
        self.size = step_samples
        self.threshold = threshold
        self.device = device

    def split(self, indices: list[int]) -> list[list[int]]:
        return [indices[i:i + self.size] for i in range(0, len(indices), self.size)]

    def back_off(self, reason: str) -> bool:
        """Halve the micro-batch; False when it is already one sample."""
        if self.size <= 1:
            return False
        self.size = max(1, self.size // 2)
        log.warning("auto_batch_size: %s; micro-batch is now %d sample(s)", reason, self.size)
        return True

    def check_peak(self) -> None:
        if self.device.type != "cuda" or self.size <= 1:
            return
        total = torch.cuda.get_device_properties(self.device).total_memory
        peak = torch.cuda.max_memory_reserved(self.device)
        if peak > self.threshold * total:
            self.back_off(f"peak {peak / 2**30:.1f} GiB passed memory_threshold "
                          f"{self.threshold:.0%} of {total / 2**30:.0f} GiB")
            torch.cuda.reset_peak_memory_stats(self.device)


def out_of_memory_message(cfg: TrainingConfig, device: torch.device, micro_samples: int,
                          longest: int, cutoff_len: int | None = None) -> str:
    peak = ""
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory / 2**30
        peak = (f" (peak {torch.cuda.max_memory_allocated(device) / 2**30:.1f} GiB of "
                f"{total:.0f} GiB)")
    hints = []
    if cfg.gradient_checkpointing in ("false", "selective"):
        hints.append("gradient_checkpointing: true (or offload for long sequences)")
    if micro_samples > 1:
        hints.append(f"per_device_train_batch_size below {micro_samples} with more "
                     "gradient_accumulation_steps, or auto_batch_size: true")
    hints.append(f"a lower cutoff_len (the longest sample of this step has {longest} tokens)")
    if not (cfg.bf16 or cfg.fp16) and device.type == "cuda":
        hints.append("bf16: true")
    return (f"out of memory on {device}{peak} in a micro-batch of {micro_samples} sample(s) "
            f"with gradient_checkpointing {cfg.gradient_checkpointing}. Memory grows with "
            "micro-batch size x sequence length (activations) and model size. Try: "
            + "; ".join(hints) + ". The last checkpoint is intact.")
