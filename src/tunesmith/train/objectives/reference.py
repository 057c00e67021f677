"""The reference model of DPO/KTO: the policy's own base with its LoRA adapters disabled
(no second copy), or a separate frozen model (`ref_model`, full/freeze runs)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext

import torch

LogpFn = Callable[[torch.nn.Module, object], torch.Tensor]


class Reference:
    """`model` None: the policy with adapters disabled (PEFT's disable_adapter)."""

    def __init__(self, model: torch.nn.Module | None = None):
        self.model = model
        if model is not None:
            model.eval()
            model.requires_grad_(False)

    @torch.no_grad()
    def logps(self, policy: torch.nn.Module, batch: object, fn: LogpFn) -> torch.Tensor:
        if self.model is not None:
            return fn(self.model, batch)
        if not hasattr(policy, "disable_adapter"):
            raise TypeError("the policy has no adapters to disable; pass a reference model")
        with policy.disable_adapter() if self.model is None else nullcontext():
            return fn(policy, batch)
