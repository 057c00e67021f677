"""The inference section: LLaMA-Factory's infer_backend for `tunesmith chat|api CONFIG`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tunesmith.config.fields import opt


@dataclass
class InferConfig:
    infer_backend: Literal["huggingface", "vllm", "sglang", "ktransformers"] = opt(
        "huggingface", "Engine of `tunesmith chat|api CONFIG.yaml`: huggingface (tunesmith's "
        "own); vllm or sglang: `tunesmith api` hands serving to that engine when it is "
        "installed (chat stops and says so); ktransformers is not run.", advanced=True)
