"""fp8 training of linear layers through torchao (Hopper or newer GPUs)."""

from __future__ import annotations

import torch

from tunesmith.errors import ConfigError


def convert_to_fp8(model: torch.nn.Module, device: torch.device,
                   fsdp_float8_all_gather: bool = False) -> int:
    """Swap the decoder's nn.Linear modules for torchao Float8Linear in place (the output
    head and layers whose sizes are not multiples of 16 stay in bf16). Returns the count."""
    if device.type != "cuda":
        raise ConfigError("fp8: needs a CUDA GPU with fp8 tensor cores (Hopper or newer); "
                          f"this run is on {device.type}. Remove fp8 (or set it false)")
    major, _ = torch.cuda.get_device_capability(device)
    if major < 9:
        raise ConfigError(f"fp8: GPU capability {major}.x has no fp8 matmul (needs 9.0, "
                          "Hopper, or newer); remove fp8")
    try:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    except ImportError:
        raise ConfigError("fp8: needs the torchao package; pip install 'tunesmith[fp8]'"
                          ) from None
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    swapped = 0

    def keep(module: torch.nn.Module, _name: str) -> bool:
        nonlocal swapped
        ok = (isinstance(module, torch.nn.Linear) and module is not head
              and module.in_features % 16 == 0 and module.out_features % 16 == 0)
        swapped += ok
        return ok

    config = Float8LinearConfig(enable_fsdp_float8_all_gather=fsdp_float8_all_gather)
    convert_to_float8_training(model, config=config, module_filter_fn=keep)
    return swapped
