"""The method section: LLaMA-Factory's adapter variants (PiSSA, OFT, LLaMA Pro, extra
trainable modules), token-loss variants (DFT, EAFT), pure bf16, quantised bases and fp8."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tunesmith.config.fields import opt


@dataclass
class MethodConfig:
    additional_target: list[str] = opt(
        [], "LoRA/OFT: modules besides the adapted ones trained fully and saved with the "
        "adapter (PEFT modules_to_save), e.g. embed_tokens,lm_head.", advanced=True)
    create_new_adapter: bool = opt(
        False, "With adapter_name_or_path: merge those adapters into the base and train a "
        "new, freshly initialised one (instead of continuing the last).", advanced=True)
    pissa_init: bool = opt(
        False, "PiSSA: initialise LoRA from the principal singular vectors of each weight "
        "(the base keeps the residual).", advanced=True)
    pissa_iter: int = opt(16, "PiSSA: fast-SVD iterations (-1: exact SVD).", minimum=-1,
                          advanced=True)
    pissa_convert: bool = opt(
        False, "PiSSA: also save the adapter converted to a plain LoRA of the original base "
        "(output_dir/pissa_converted; the initial one in output_dir/pissa_init).",
        advanced=True)
    oft_rank: int = opt(0, "OFT: number of blocks r (0: derived from oft_block_size).",
                        minimum=0, advanced=True)
    oft_block_size: int = opt(32, "OFT: block size of the orthogonal matrices.", minimum=0,
                              advanced=True)
    oft_target: list[str] = opt(["all"], "OFT: linear modules to adapt (all, or names).",
                                advanced=True)
    module_dropout: float = opt(0.0, "OFT: multiplicative dropout on the blocks.", minimum=0,
                                maximum=1, advanced=True)
    use_llama_pro: bool = opt(
        False, "LLaMA Pro (finetuning_type freeze): train only the inserted blocks, every "
        "(layers / freeze_trainable_layers)-th layer of a model expanded beforehand.",
        advanced=True)
    freeze_extra_modules: list[str] = opt(
        [], "freeze: modules outside the decoder layers to train too, e.g. embed_tokens,norm.",
        advanced=True)
    use_dft_loss: bool = opt(
        False, "DFT loss: each token's cross-entropy weighted by its (detached) probability.",
        advanced=True)
    use_eaft_loss: bool = opt(
        False, "EAFT loss: each token's cross-entropy weighted by (top-20 entropy / 3) ** "
        "eaft_alpha (detached).", advanced=True)
    eaft_alpha: float = opt(1.0, "EAFT: power of the entropy weight.", minimum=0,
                            advanced=True)
    use_asft_loss: bool = opt(
        False, "ASFT loss: the DFT loss plus asft_alpha x KL(reference || model) per trained "
        "token; the reference is a frozen copy of the model as training starts (memory for a "
        "second model).", advanced=True)
    asft_alpha: float = opt(0.1, "ASFT: weight of the KL anchor.", minimum=0, advanced=True)
    pure_bf16: bool = opt(
        False, "Train in bf16 without fp32 master weights (GPU; the whole model, trainable "
        "parameters and optimizer state in bf16). CPU runs stay fp32.", advanced=True)
    quantization_bit: int = opt(
        0, "Load the base quantised to 4 or 8 bits with bitsandbytes (QLoRA; 0: off).",
        choices=None, minimum=0, maximum=8, advanced=True)
    quantization_method: Literal["bnb"] = opt(
        "bnb", "Quantisation library for quantization_bit: bnb (bitsandbytes).", advanced=True)
    quantization_type: Literal["nf4", "fp4"] = opt("nf4", "4-bit data type.", advanced=True)
    double_quantization: bool = opt(True, "4-bit: quantise the quantisation constants too.",
                                    advanced=True)
    fp8: bool = opt(
        False, "fp8 training of the decoder's linear layers through torchao (Hopper or newer "
        "GPU; torchao extra). CPU runs stop with an error.", advanced=True)
    fp8_backend: Literal["auto", "torchao"] = opt(
        "auto", "fp8 backend: auto or torchao (Transformer Engine and MS-AMP are not "
        "wired).", advanced=True)
    fp8_enable_fsdp_float8_all_gather: bool = opt(
        False, "fp8 with FSDP2: all-gather weights in float8.", advanced=True)
