"""The optimizer section: `optim` and LLaMA-Factory's optimizer families (LoRA+, GaLore,
APOLLO, BAdam, Adam-mini, Muon). train/optim/ turns it into an optimizer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tunesmith.config.fields import opt

OptimName = Literal[
    "adamw_torch", "adamw_torch_fused", "adamw_8bit", "adamw_bnb_8bit", "paged_adamw_8bit",
    "paged_adamw", "paged_adamw_32bit", "adafactor", "sgd", "adagrad", "rmsprop"]


@dataclass
class OptimConfig:
    optim: OptimName = opt(
        "adamw_torch", "Optimizer (HF Trainer names): adamw_torch (fused on CUDA), "
        "adamw_torch_fused, adamw_8bit / paged_adamw_8bit / paged_adamw_32bit (bitsandbytes "
        "extra), adafactor, sgd, adagrad, rmsprop. use_galore, use_apollo, use_badam, "
        "use_adam_mini and use_muon pick those families instead.", advanced=True)
    optim_args: str = opt(
        "", "Extra optimizer arguments as HF writes them: key=value,key=value (numbers, true/"
        "false), e.g. momentum=0.9 for sgd.", advanced=True)
    loraplus_lr_ratio: float = opt(
        0.0, "LoRA+: learning rate of the LoRA B matrices = learning_rate x this ratio "
        "(0: off; LLaMA-Factory suggests 16).", minimum=0, advanced=True)
    loraplus_lr_embedding: float = opt(
        1e-6, "LoRA+: learning rate of LoRA adapters on embedding layers.", minimum=0,
        advanced=True)
    use_galore: bool = opt(False, "GaLore: AdamW with gradients projected to a low rank "
                                  "(galore extra).", advanced=True)
    galore_target: list[str] = opt(["all"], "GaLore: linear modules to project (all, or "
                                            "names such as q_proj,v_proj).", advanced=True)
    galore_rank: int = opt(16, "GaLore: projection rank.", minimum=1, advanced=True)
    galore_update_interval: int = opt(200, "GaLore: steps between projection updates.",
                                      minimum=1, advanced=True)
    galore_scale: float = opt(2.0, "GaLore: scale of the projected update.", minimum=0,
                              advanced=True)
    galore_proj_type: Literal["std", "reverse_std", "right", "left", "full"] = opt(
        "std", "GaLore: projection side.", advanced=True)
    galore_layerwise: bool = opt(
        False, "GaLore: LLaMA-Factory steps each parameter inside backward to save gradient "
        "memory; tunesmith takes the identical update at the step (a warning says the memory "
        "saving is not realised). Needs gradient_accumulation_steps 1, as in LLaMA-Factory.",
        advanced=True)
    use_apollo: bool = opt(False, "APOLLO: SGD-like memory, AdamW-like updates (apollo "
                                  "extra).", advanced=True)
    apollo_target: list[str] = opt(["all"], "APOLLO: linear modules (all or names).",
                                   advanced=True)
    apollo_rank: int = opt(16, "APOLLO: projection rank.", minimum=1, advanced=True)
    apollo_update_interval: int = opt(200, "APOLLO: steps between projection updates.",
                                      minimum=1, advanced=True)
    apollo_scale: float = opt(32.0, "APOLLO: update scale.", minimum=0, advanced=True)
    apollo_proj: Literal["svd", "random"] = opt("random", "APOLLO: projection kind.",
                                                advanced=True)
    apollo_proj_type: Literal["std", "right", "left"] = opt("std", "APOLLO: projection side.",
                                                            advanced=True)
    apollo_scale_type: Literal["channel", "tensor"] = opt(
        "channel", "APOLLO: scaling granularity.", advanced=True)
    apollo_layerwise: bool = opt(
        False, "APOLLO: as galore_layerwise (same update at the step, with a warning).",
        advanced=True)
    apollo_scale_front: bool = opt(False, "APOLLO: scale before norm-growth limiting.",
                                   advanced=True)
    use_badam: bool = opt(False, "BAdam: block-coordinate Adam, one block of layers trained "
                                 "at a time (badam extra; finetuning_type full).",
                          advanced=True)
    badam_mode: Literal["layer", "ratio"] = opt(
        "layer", "BAdam: switch whole layers (layer); ratio mode is refused (it needs "
        "DeepSpeed-free sparse masks that tunesmith does not wire).", advanced=True)
    badam_start_block: int = opt(-1, "BAdam: first block (-1: by badam_switch_mode).",
                                 minimum=-1, advanced=True)
    badam_switch_mode: Literal["ascending", "descending", "random", "fixed"] = opt(
        "ascending", "BAdam: order of blocks.", advanced=True)
    badam_switch_interval: int = opt(50, "BAdam: optimizer steps per block (-1: never "
                                         "switch).", minimum=-1, advanced=True)
    badam_update_ratio: float = opt(0.05, "BAdam ratio mode: share of parameters updated.",
                                    minimum=0, maximum=1, advanced=True)
    badam_mask_mode: Literal["adjacent", "scatter"] = opt(
        "adjacent", "BAdam ratio mode: mask layout.", advanced=True)
    badam_verbose: int = opt(0, "BAdam: 0 quiet, 1 block switches, 2 trainable parameters.",
                             minimum=0, maximum=2, advanced=True)
    use_adam_mini: bool = opt(False, "Adam-mini: one learning rate per parameter block "
                                     "(adam-mini extra).", advanced=True)
    use_muon: bool = opt(False, "Muon (torch.optim.Muon) for the 2-D weights of the decoder "
                                "layers, AdamW for the rest (embeddings, head, norms, biases).",
                         advanced=True)
