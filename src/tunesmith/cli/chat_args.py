"""Model arguments shared by `tunesmith chat` and `tunesmith api`: flags, or a YAML."""

from __future__ import annotations

import argparse
from typing import Any

from tunesmith.errors import TunesmithError


def model_args(ns: argparse.Namespace) -> tuple[str, list[str], str, str]:
    """(model, adapters, template, infer_backend) from the flags, or else an optional YAML's
    keys of the same names (flags win)."""
    model, adapters, template = ns.model_name_or_path, ns.adapter_name_or_path, ns.template
    backend = getattr(ns, "infer_backend", "")
    if ns.config:
        from tunesmith.config.loader import read_yaml

        raw = {k: v for k, (v, _) in read_yaml(ns.config).items()}
        model = model or raw.get("model_name_or_path", "")
        adapters = adapters or raw.get("adapter_name_or_path") or ""
        template = template or raw.get("template") or ""
        backend = backend or raw.get("infer_backend") or ""
    if not model:
        raise TunesmithError("give --model_name_or_path (or a YAML that sets it)")
    adapter_list = adapters if isinstance(adapters, list) else [
        a.strip() for a in str(adapters).split(",") if a.strip()]
    return model, adapter_list, template, backend or "huggingface"


def engine_from_args(ns: argparse.Namespace) -> Any:
    """An HFEngine from --model_name_or_path / --adapter_name_or_path / --template (flags win
    over the same keys of an optional YAML)."""
    from tunesmith.infer.engine import HFEngine

    model, adapter_list, template, _ = model_args(ns)
    return HFEngine(model, adapter_list, template, ns.device, ns.trust_remote_code)
