"""`tunesmith env`: what a bug report needs."""

from __future__ import annotations

import importlib
import platform
import sys

from tunesmith import __version__


def _version(module: str) -> str:
    try:
        return getattr(importlib.import_module(module), "__version__", "installed")
    except ImportError:
        return "not installed"


def env_report() -> str:
    import torch

    rows = [("tunesmith", __version__), ("python", sys.version.split()[0]),
            ("platform", platform.platform()), ("torch", torch.__version__),
            ("cuda (torch build)", torch.version.cuda or "none (CPU build)")]
    for mod in ("transformers", "peft", "accelerate", "safetensors", "tokenizers", "datasets",
                "gguf", "deepspeed", "liger_kernel", "triton", "ray"):
        rows.append((mod, _version(mod)))
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            rows.append((f"device cuda:{i}", f"{props.name}, {props.total_memory / 2**30:.0f} GiB"))
    else:
        rows.append(("devices", f"cpu only ({torch.get_num_threads()} threads)"))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)
