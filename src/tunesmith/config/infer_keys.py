"""The inference section: LLaMA-Factory's infer_backend for `tunesmith chat|api CONFIG`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tunesmith.config.fields import opt

INFER_BACKEND_REFUSED = {
    "vllm": "tunesmith serves with its own engine (transformers generate, batched); serve the "
            "merged model with vLLM itself (tunesmith export, then `vllm serve EXPORT_DIR`)",
    "sglang": "tunesmith serves with its own engine; serve the merged model with SGLang itself "
              "(tunesmith export, then `python -m sglang.launch_server --model-path DIR`)",
    "ktransformers": "KTransformers is a separate engine that tunesmith does not embed",
}


@dataclass
class InferConfig:
    infer_backend: Literal["huggingface", "vllm", "sglang", "ktransformers"] = opt(
        "huggingface", "`tunesmith chat|api CONFIG.yaml` engine: huggingface (tunesmith's "
        "transformers engine). vllm, sglang and ktransformers stop with the command that "
        "serves the exported model with them.", advanced=True)
