"""One optimizer made of several (Muon for matrices + AdamW for the rest), so the loop,
the scheduler and checkpoints see a single object."""

from __future__ import annotations

from typing import Any

import torch


class CompositeOptimizer(torch.optim.Optimizer):
    """Steps each part; `param_groups` are the parts' own group dicts, so a scheduler
    changing `lr` here changes it in the part that owns the group."""

    def __init__(self, parts: list[torch.optim.Optimizer]):
        self.parts = parts
        groups = [g for part in parts for g in part.param_groups]
        super().__init__(groups, {})
        self.param_groups = groups  # the very dicts of the parts

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = closure() if closure is not None else None
        for part in self.parts:
            part.step()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        for part in self.parts:
            part.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return {"parts": [part.state_dict() for part in self.parts]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        for part, saved in zip(self.parts, state_dict["parts"], strict=True):
            part.load_state_dict(saved)
