"""Speed and memory presets of the Train tab: each fills the speed levers of the form.

The figures quoted (what each preset costs) are the measured ones in
docs/benchmarks/gpu_train.md: Qwen2.5-7B shapes, LoRA r16 on one H200.
"""

from __future__ import annotations

from typing import Any

PRESETS: dict[str, dict[str, Any]] = {
    # no recompute, regional compilation, padding-free packed rows
    "fastest": {"packing": True, "torch_compile": "true", "gradient_checkpointing": "false",
                "attn_implementation": "varlen", "bf16": True},
    # recomputed activations kept on the CPU, packed rows, compiled layers
    "least_memory": {"packing": True, "torch_compile": "true",
                     "gradient_checkpointing": "offload", "attn_implementation": "varlen",
                     "bf16": True},
}
PRESET_CHOICES: tuple[str, ...] = ("custom", *PRESETS)


def preset_values(name: str, keys: list[str]) -> list[Any]:
    """The form values a preset sets, in the order of `keys` (None: leave as it is)."""
    chosen = PRESETS.get(name, {})
    return [chosen.get(k) for k in keys]
