"""Model arguments shared by `tunesmith chat` and `tunesmith api`: flags, or a YAML."""

from __future__ import annotations

import argparse
from typing import Any

from tunesmith.errors import TunesmithError


def engine_from_args(ns: argparse.Namespace) -> Any:
    """An HFEngine from --model_name_or_path / --adapter_name_or_path / --template (flags win
    over the same keys of an optional YAML)."""
    from tunesmith.infer.engine import HFEngine

    model, adapters, template = ns.model_name_or_path, ns.adapter_name_or_path, ns.template
    trust = ns.trust_remote_code
    if ns.config:  # checked like a training YAML: unknown or unsupported keys stop here
        from tunesmith.config.infer_keys import INFER_BACKEND_REFUSED
        from tunesmith.config.loader import load_config

        cfg = load_config(ns.config)
        backend = cfg.infer.infer_backend
        if backend in INFER_BACKEND_REFUSED:
            raise TunesmithError(f"infer_backend: {backend} is not run by tunesmith (from "
                                 f"{ns.config}): {INFER_BACKEND_REFUSED[backend]}; or set "
                                 "infer_backend: huggingface")
        model = model or cfg.model.model_name_or_path
        adapters = adapters or cfg.model.adapter_name_or_path
        template = template or cfg.model.template
        trust = trust or cfg.model.trust_remote_code
    if not model:
        raise TunesmithError("give --model_name_or_path (or a YAML that sets it)")
    adapter_list = adapters if isinstance(adapters, list) else [
        a.strip() for a in str(adapters).split(",") if a.strip()]
    return HFEngine(model, adapter_list, template, ns.device, trust)
