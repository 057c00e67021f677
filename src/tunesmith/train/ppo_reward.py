"""Reward scores of PPO rollouts, from one of three reward models (reward_model_type):

    lora  the `stage: rm` adapter loaded beside the policy's own adapter on the same base
          (no second copy), its value head apart; scoring switches the active adapter
    full  a separate frozen model (+ reward_model_adapters merged) with its value head
    api   an HTTP service: POST {"model": "model", "messages": [text, ...]} -> {"scores": [...]}

A score is the value head's output at the last token of [query | response].
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

import torch

from tunesmith.errors import ConfigError, TrainingError
from tunesmith.runs.folder import VALUE_HEAD_FILE
from tunesmith.train.objectives.reward import ValueHead, load_value_head
from tunesmith.train.ppo_rollout import build_sequences, trunk_rows

REWARD_ADAPTER = "reward"


class RewardModel(Protocol):
    def scores(self, queries: list[list[int]], responses: list[list[int]]) -> torch.Tensor:
        """[B] float32 scores on the CPU."""
        ...


def read_value_head(folder: Path, hidden_size: int, key: str) -> ValueHead:
    if not (folder / VALUE_HEAD_FILE).is_file():
        raise ConfigError(f"{key}: {str(folder)!r} has no {VALUE_HEAD_FILE}; a reward model "
                          "is the output folder of a `stage: rm` run (it saves the value head "
                          "beside the adapter or model)")
    return load_value_head(folder, hidden_size)


@contextmanager
def active_adapter(model: Any, name: str) -> Iterator[None]:
    """Run with PEFT adapter `name` active; the trainable flags are restored after (PEFT's
    set_adapter marks the active adapter trainable)."""
    flags = {n: p.requires_grad for n, p in model.named_parameters()}
    model.set_adapter(name)
    try:
        yield
    finally:
        model.set_adapter("default")
        for n, p in model.named_parameters():
            p.requires_grad_(flags[n])


class HeadReward:
    """A trunk (the policy with the reward adapter active, or a separate model) + value head."""

    def __init__(self, model: torch.nn.Module, head: ValueHead, pad_id: int,
                 adapter: str | None = None):
        self.model, self.head, self.pad_id, self.adapter = model, head, pad_id, adapter
        device = next(model.parameters()).device
        self.head.to(device).requires_grad_(False)

    @torch.no_grad()
    def scores(self, queries: list[list[int]], responses: list[list[int]]) -> torch.Tensor:
        device = next(self.model.parameters()).device
        seqs = build_sequences(queries, responses, self.pad_id, device)
        if self.adapter is None:
            rows = trunk_rows(self.model, seqs)
        else:
            with active_adapter(self.model, self.adapter):
                rows = trunk_rows(self.model, seqs)
        return self.head(rows.index_select(0, seqs.last)).float().cpu()


class ApiReward:
    def __init__(self, url: str, decode: Any, timeout_s: float = 60.0):
        self.url, self.decode, self.timeout_s = url, decode, timeout_s

    def scores(self, queries: list[list[int]], responses: list[list[int]]) -> torch.Tensor:
        texts = [self.decode(q + r) for q, r in zip(queries, responses, strict=True)]
        body = json.dumps({"model": "model", "messages": texts}).encode()
        request = urllib.request.Request(self.url, data=body, method="POST",
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as reply:
                scores = json.loads(reply.read())["scores"]
        except (urllib.error.URLError, OSError) as exc:
            raise TrainingError(f"reward_model: the scoring API {self.url!r} could not be "
                                f"reached ({exc}); start the reward service or fix the URL "
                                "(reward_model_type: api)") from None
        except (KeyError, TypeError, ValueError) as exc:
            raise TrainingError(f"reward_model: {self.url!r} answered without a JSON "
                                f"'scores' list ({exc!r}); it must reply "
                                '{"scores": [one number per message]}') from None
        if len(scores) != len(texts):
            raise TrainingError(f"reward_model: {self.url!r} returned {len(scores)} scores "
                                f"for {len(texts)} messages; it must return one per message")
        return torch.tensor([float(x) for x in scores], dtype=torch.float32)
