"""Model arguments shared by `tunesmith chat` and `tunesmith api`."""

from __future__ import annotations

import argparse
from typing import Any

from tunesmith.errors import TunesmithError


def chat_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tunesmith chat")
    p.add_argument("config", nargs="?", help="optional YAML with model_name_or_path etc.")
    p.add_argument("--model_name_or_path", default="")
    p.add_argument("--adapter_name_or_path", default="")
    p.add_argument("--template", default="")
    p.add_argument("--prompt", default=None, help="answer this once and exit")
    p.add_argument("--system", default=None, help="system message")
    p.add_argument("--image", action="append", default=[],
                   help="image file shown with the (first) prompt; repeatable")
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--top_p", type=float, default=1.0)
    p.add_argument("--top_k", type=int, default=0)
    p.add_argument("--max_new_tokens", type=int, default=256)
    p.add_argument("--repetition_penalty", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--device", default="auto")
    p.add_argument("--trust_remote_code", action="store_true")
    return p


def model_args(ns: argparse.Namespace) -> tuple[str, list[str], str, str]:
    """(model, adapters, template, infer_backend) from the flags, or else an optional YAML's
    keys of the same names (flags win). The YAML is checked like a training YAML (unknown
    or unsupported keys stop here, as for LLaMA-Factory's examples/inference files); its
    trust_remote_code: true turns the flag on."""
    model, adapters, template = ns.model_name_or_path, ns.adapter_name_or_path, ns.template
    backend = getattr(ns, "infer_backend", "")
    if ns.config:
        from tunesmith.config.loader import load_config

        cfg = load_config(ns.config)
        model = model or cfg.model.model_name_or_path
        adapters = adapters or cfg.model.adapter_name_or_path
        template = template or cfg.model.template
        backend = backend or cfg.infer.infer_backend
        ns.trust_remote_code = ns.trust_remote_code or cfg.model.trust_remote_code
    if not model:
        raise TunesmithError("give --model_name_or_path (or a YAML that sets it)")
    adapter_list = adapters if isinstance(adapters, list) else [
        a.strip() for a in str(adapters).split(",") if a.strip()]
    return model, adapter_list, template, backend or "huggingface"


def engine_from_args(ns: argparse.Namespace, verb: str = "chat") -> Any:
    """An HFEngine from --model_name_or_path / --adapter_name_or_path / --template (flags win
    over the same keys of an optional YAML). `tunesmith chat` runs only this engine, so a
    YAML asking for another backend stops with where that backend is served."""
    from tunesmith.infer.engine import HFEngine

    model, adapter_list, template, backend = model_args(ns)
    if verb == "chat" and backend != "huggingface":
        raise TunesmithError(f"infer_backend: {backend} is not run by tunesmith chat (from "
                             f"{ns.config or 'the command line'}): chat uses tunesmith's own "
                             "engine (infer_backend: huggingface); serve with `tunesmith api "
                             "CONFIG.yaml`, which hands serving to vLLM or SGLang when "
                             "installed, or remove the key")
    return HFEngine(model, adapter_list, template, ns.device, ns.trust_remote_code)
