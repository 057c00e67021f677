"""Reward model: a value head on the last hidden state, trained on pairs with the
pairwise (Bradley-Terry) loss  L = -log sigmoid(s_chosen - s_rejected).

The head is saved beside the adapter as `value_head.safetensors` with the tensor names
LLaMA-Factory (TRL's value head) uses: v_head.summary.weight [1, H], v_head.summary.bias [1].
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn.functional as F

from tunesmith.runs.folder import VALUE_HEAD_FILE

VALUE_HEAD_ATTR = "v_head"


class ValueHead(torch.nn.Module):
    """hidden [N, H] -> score [N]."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.summary = torch.nn.Linear(hidden_size, 1)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.summary(hidden.to(self.summary.weight.dtype)).squeeze(-1).float()


def pairwise_losses(chosen: torch.Tensor, rejected: torch.Tensor) -> torch.Tensor:
    """[P] scores of chosen and rejected -> [P] losses."""
    return -F.logsigmoid(chosen - rejected)


def pairwise_loss_reference(chosen: float, rejected: float) -> float:
    """-log P(chosen preferred), P = exp(s_c) / (exp(s_c) + exp(s_r)) (Bradley-Terry)."""
    return -math.log(math.exp(chosen) / (math.exp(chosen) + math.exp(rejected)))


def attach_value_head(model: torch.nn.Module, hidden_size: int, seed: int) -> ValueHead:
    """A trainable value head registered on `model` (so the optimizer, checkpoints and
    distributed wrappers see it); created in fp32 with a fixed seed."""
    device = next(model.parameters()).device
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        head = ValueHead(hidden_size).to(device)
    model.add_module(VALUE_HEAD_ATTR, head)
    return head


def save_value_head(head: torch.nn.Module, folder: Path,
                    state: dict[str, torch.Tensor] | None = None) -> None:
    """Write value_head.safetensors; `state`: the head's tensors gathered elsewhere."""
    from safetensors.torch import save_file

    tensors = state if state is not None else {
        f"{VALUE_HEAD_ATTR}.summary.{k}": v for k, v in head.summary.state_dict().items()}
    save_file({k: v.detach().float().cpu().contiguous() for k, v in tensors.items()},
              str(folder / VALUE_HEAD_FILE))


def load_value_head(folder: Path, hidden_size: int) -> ValueHead:
    from safetensors.torch import load_file

    tensors = load_file(str(folder / VALUE_HEAD_FILE))
    head = ValueHead(hidden_size)
    prefix = f"{VALUE_HEAD_ATTR}.summary."
    head.summary.load_state_dict({k[len(prefix):]: v for k, v in tensors.items()})
    return head
