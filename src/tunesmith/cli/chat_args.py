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


def engine_from_args(ns: argparse.Namespace) -> Any:
    """An HFEngine from --model_name_or_path / --adapter_name_or_path / --template (a YAML's
    keys arrive as these options too: cli/arguments.py)."""
    from tunesmith.infer.engine import HFEngine

    if not ns.model_name_or_path:
        raise TunesmithError("give --model_name_or_path (or a YAML that sets it)")
    adapter_list = [a.strip() for a in str(ns.adapter_name_or_path).split(",") if a.strip()]
    return HFEngine(ns.model_name_or_path, adapter_list, ns.template, ns.device,
                    ns.trust_remote_code)
