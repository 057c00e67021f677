"""Fold PEFT adapters into their base model, in the order given, in fp32.

    base (alias | folder | .gguf | hub id) --resolve--> local folder --refuse if quantised-->
    fp32 model --adapter 1: load, merge_and_unload--> ... --adapter n--> plain transformers model

The merge runs in fp32 whatever the base's saved dtype, so rounding happens once, when the
merged weights are written in the base's own dtype.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from tunesmith.adapters.saved import saved_chat_template
from tunesmith.config.environment import hub_offline
from tunesmith.config.schema import ModelConfig
from tunesmith.data.template import load_template_source
from tunesmith.errors import ConfigError, ModelError
from tunesmith.models.loader import load_causal_lm, load_tokenizer
from tunesmith.models.provision import resolve_model_path

log = logging.getLogger(__name__)


@dataclass
class MergedModel:
    """A base model with every adapter folded in, and what it was made from."""

    model: torch.nn.Module
    tokenizer: Any
    template_source: str  # "" when neither the adapter nor the tokenizer carries one
    base_name: str  # model_name_or_path as the user wrote it
    base_path: str  # the local folder (or hub id) it resolved to
    adapters: list[str] = field(default_factory=list)
    save_dtype: torch.dtype = torch.float32


def load_base_config(path: str, trust_remote_code: bool = False) -> Any:
    """The transformers config of a resolved model reference."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code,
                                          local_files_only=hub_offline())
    except (OSError, ValueError) as exc:
        raise ModelError(f"could not read the config of {path!r}: {exc}") from None


def check_unquantised(config: Any, name: str) -> None:
    """Refuse a GPTQ / AWQ / bitsandbytes (or any other quantised) base.

    Raises:
        ModelError: the base carries a quantization_config.
    """
    qcfg = getattr(config, "quantization_config", None)
    if not qcfg:
        return
    method = qcfg.get("quant_method") if isinstance(qcfg, dict) else getattr(
        qcfg, "quant_method", None)
    method = getattr(method, "value", method) or "unknown method"
    raise ModelError(
        f"model_name_or_path: {name!r} is a quantised model ({method}). Adapters cannot be "
        "merged into quantised weights: the sum would be rounded back to the quantisation grid, "
        "losing most of what was tuned, and the result could not be saved as a plain model. "
        "Merge into the unquantised base instead: set model_name_or_path to the full-precision "
        "model this one was quantised from (a LoRA/QLoRA adapter applies to it unchanged), then "
        "quantise the merged export if you need a small file (export_format: gguf, "
        "gguf_type: q8_0).")


def saved_dtype(config: Any) -> torch.dtype:
    """The dtype the base was saved in (fp32 when the config does not say)."""
    value = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if isinstance(value, str):
        value = getattr(torch, value, None)
    return value if isinstance(value, torch.dtype) else torch.float32


def check_adapters(paths: list[str]) -> None:
    for path in paths:
        if not (Path(path) / "adapter_config.json").is_file():
            raise ModelError(f"adapter_name_or_path: {path!r} is not a PEFT adapter folder (no "
                             "adapter_config.json); give the output_dir of a LoRA run")


def resolve_template(template: str, adapters: list[str], tokenizer: Any) -> str:
    """The chat template to ship: the adapter's own, else `template:`, else the tokenizer's."""
    trained = saved_chat_template(adapters)
    if trained is not None:
        if template and load_template_source(template, tokenizer)[1] != trained:
            raise ConfigError(f"template: {template!r} differs from the template adapter "
                              f"{adapters[-1]!r} was trained with; remove template: to export "
                              "with the adapter's own")
        return trained
    try:
        return load_template_source(template, tokenizer)[1]
    except ConfigError:
        if template:
            raise
        return ""  # a base model without a chat template still exports


def merge_adapters(model_cfg: ModelConfig, device: str = "cpu") -> MergedModel:
    """Load the base in fp32 on `device` and merge every adapter into it, in order.

    Raises:
        ModelError: missing adapter folders, a quantised base, or a model that fails to load.
        ConfigError: `template:` contradicts the adapter's trained template.
    """
    from peft import PeftModel
    from tqdm.auto import tqdm

    name, adapters = model_cfg.model_name_or_path, list(model_cfg.adapter_name_or_path)
    check_adapters(adapters)
    path = resolve_model_path(name, model_cfg.cache_dir or None)
    config = load_base_config(path, model_cfg.trust_remote_code)
    check_unquantised(config, name)
    tok_source = adapters[-1] if adapters and (
        Path(adapters[-1]) / "tokenizer_config.json").is_file() else path
    tokenizer = load_tokenizer(tok_source, trust_remote_code=model_cfg.trust_remote_code)
    template = resolve_template(model_cfg.template, adapters, tokenizer)
    target = "cuda" if device == "auto" and torch.cuda.is_available() else "cpu"
    model = load_causal_lm(path, dtype=torch.float32, trust_remote_code=model_cfg.trust_remote_code,
                           device=target)
    for adapter in tqdm(adapters, desc="merging adapters", unit="adapter",
                        disable=not adapters):
        model = PeftModel.from_pretrained(model, adapter).merge_and_unload(progressbar=True)
    model.eval()
    return MergedModel(model=model, tokenizer=tokenizer, template_source=template,
                       base_name=name, base_path=path, adapters=adapters,
                       save_dtype=saved_dtype(config))
