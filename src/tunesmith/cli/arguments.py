"""One argument grammar for every verb: `[CONFIG.yaml] [key=value ...] [--key value ...]`.

train, eval and export take config keys (config/loader.py). chat, api and webui take
options of their own; this module gives them the same forms:

    key=value          -> --key value         (a flag: key=true -> --key, key=false -> off)
    CONFIG.yaml        -> --key value for every key the verb has (the command line wins)

An unknown key=value is an error with the nearest options. A YAML key the verb does not
use (an inference YAML of LLaMA-Factory carries keys such as `infer_backend`) is named in
one warning with its file:line.
"""

from __future__ import annotations

import argparse
import difflib
import logging
from typing import Any

from tunesmith.errors import ConfigError

log = logging.getLogger(__name__)
CONFIG_SUFFIXES = (".yaml", ".yml", ".json")


def parse_verb_args(parser: argparse.ArgumentParser, args: list[str]) -> argparse.Namespace:
    """Parse `args` for a verb whose options are declared in `parser` (optional positional
    `config` holds the YAML path)."""
    actions = _long_options(parser)
    path, tokens = _split_args(parser.prog, args, actions)
    from_yaml = _yaml_tokens(parser.prog, path, actions) if path else []
    positional = [path] if path and "config" in _dests(parser) else []
    return parser.parse_args(positional + from_yaml + tokens)


def _long_options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    # argparse has no public listing of its actions; reading it changes nothing
    return {opt[2:]: a for a in parser._actions for opt in a.option_strings
            if opt.startswith("--") and opt != "--help"}


def _dests(parser: argparse.ArgumentParser) -> set[str]:
    return {a.dest for a in parser._actions}


def _is_flag(action: argparse.Action) -> bool:
    return action.nargs == 0  # store_true / store_false


def _split_args(prog: str, args: list[str], actions: dict[str, argparse.Action]
                ) -> tuple[str | None, list[str]]:
    """-> (the YAML path or None, argparse tokens with key=value turned into --key value)."""
    path, out = None, []
    takes_value = False  # the previous token was an option that takes a value
    for arg in args:
        if takes_value or arg.startswith("-"):
            out.append(arg)
            name = arg[2:] if arg.startswith("--") else ""
            takes_value = (not takes_value and "=" not in arg and name in actions
                           and not _is_flag(actions[name]))
        elif "=" in arg:
            key, _, value = arg.partition("=")
            out += _option_tokens(prog, key, value, actions, "command line")
        elif path is None and arg.endswith(CONFIG_SUFFIXES):
            path = arg
        else:
            out.append(arg)
    return path, out


def _option_tokens(prog: str, key: str, value: Any, actions: dict[str, argparse.Action],
                   where: str) -> list[str]:
    if key not in actions:
        near = difflib.get_close_matches(key, list(actions), n=3, cutoff=0.6)
        hint = f"; did you mean {', '.join(near)}?" if near else ""
        raise ConfigError(f"{prog}: unknown option {key!r} (from {where}){hint} "
                          f"Options: {', '.join(sorted(actions))}")
    action = actions[key]
    if _is_flag(action):
        text = str(value).lower()
        if text not in ("true", "false", "yes", "no", "1", "0"):
            raise ConfigError(f"{prog}: {key} is a flag; expected true or false, got "
                              f"{value!r} (from {where})")
        return [f"--{key}"] if text in ("true", "yes", "1") else []
    if isinstance(value, list):
        if isinstance(action.default, list):  # a repeatable option (--stop)
            return [t for v in value for t in (f"--{key}", str(v))]
        value = ",".join(str(v) for v in value)
    return [f"--{key}", str(value)]


def _yaml_tokens(prog: str, path: str, actions: dict[str, argparse.Action]) -> list[str]:
    from tunesmith.config.loader import read_yaml

    out: list[str] = []
    unused: list[str] = []
    for key, (value, where) in read_yaml(path).items():
        if value is None:  # `key: null` keeps the default
            continue
        if key in actions:
            out += _option_tokens(prog, key, value, actions, where)
        else:
            unused.append(f"{where}: {key}")
    if unused:
        log.warning("%s: %d key(s) of %s are not options of this command and are ignored:\n  %s",
                    prog, len(unused), path, "\n  ".join(unused))
    return out
