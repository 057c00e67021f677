"""Read YAML + command-line overrides into a validated `Config`.

Every problem is collected and reported at once: unknown keys (with the nearest valid
ones), LLaMA-Factory keys not supported yet, wrong types and out-of-range values, each
naming the key, the value and where it came from (file:line or the command line).
"""

from __future__ import annotations

import dataclasses
import difflib
from pathlib import Path
from typing import Any

import yaml

from tunesmith.config.lf_keys import llamafactory_keys
from tunesmith.config.refused import REFUSED_KEYS, refused_message
from tunesmith.config.schema import (
    Config,
    field_choices,
    field_index,
    field_kind,
)
from tunesmith.config.speed import resolve_speed_aliases, speed_conflicts
from tunesmith.config.unsupported import LLAMA_FACTORY_KEYS_NOT_YET_SUPPORTED
from tunesmith.errors import ConfigError

# key -> (value, where it came from)
RawConfig = dict[str, tuple[Any, str]]


def parse_cli_args(argv: list[str]) -> tuple[str | None, RawConfig]:
    """Split `[cfg.yaml] [key=value ...] [--key value ...] [--flag]` into a path and overrides."""
    path: str | None = None
    raw: RawConfig = {}
    index = field_index()
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("--"):
            key, eq, value = arg[2:].partition("=")
            if not eq:
                is_flag = key in index and field_kind(index[key][1]) == "bool"
                nxt = argv[i + 1] if i + 1 < len(argv) else None
                if nxt is None or nxt.startswith("--") or (is_flag and not _is_bool_text(nxt)):
                    if not is_flag and key in index:
                        raise ConfigError(f"--{key} needs a value (command line)")
                    value = "true"
                else:
                    value = nxt
                    i += 1
            raw[key] = (_parse_scalar(value), "command line")
        elif "=" in arg:
            key, _, value = arg.partition("=")
            raw[key] = (_parse_scalar(value), "command line")
        elif path is None and arg.endswith((".yaml", ".yml", ".json")):
            path = arg
        else:
            raise ConfigError(f"unexpected argument {arg!r} (command line); expected a "
                              "config file, key=value or --key value")
        i += 1
    return path, raw


def _is_bool_text(text: str) -> bool:
    return text.lower() in {"true", "false", "yes", "no", "1", "0"}


def _parse_scalar(text: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def read_yaml(path: str | Path) -> RawConfig:
    """Read a flat YAML mapping, remembering the line of every key."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file {str(p)!r} does not exist; give the path to a YAML file")
    text = p.read_text(encoding="utf-8")
    try:
        node = yaml.compose(text)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p}: not valid YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: the top level must be a mapping of key: value")
    if _is_token_file(data):
        raise ConfigError(token_file_message(p, data))
    lines = {k.value: k.start_mark.line + 1 for k, _ in node.value} if node else {}
    return {str(k): (v, f"{p}:{lines.get(k, '?')}") for k, v in data.items()}


def _is_token_file(data: dict) -> bool:
    """A mapping of special tokens ('<|x|>', '<x>') to descriptions, as LLaMA-Factory's
    new_special_tokens_config reads (its extras/multi_tokens/tokens_cfg.yaml)."""
    return bool(data) and all(isinstance(k, str) and k.startswith("<") and k.endswith(">")
                              and isinstance(v, str) for k, v in data.items())


def token_file_message(path: Path, data: dict) -> str:
    shown = ", ".join(list(data)[:3])
    return (f"{path} is not a training config: it maps {len(data)} special tokens ({shown}, "
            "...) to descriptions, a token file for new_special_tokens_config. Name it from a "
            f"training YAML instead: `new_special_tokens_config: {path}` (and "
            "init_special_tokens: desc_init to start each new embedding from its description)")


def load_config(path: str | Path | None = None, overrides: RawConfig | dict | None = None,
                ) -> Config:
    """YAML file (optional) + overrides -> validated Config."""
    raw: RawConfig = read_yaml(path) if path else {}
    for key, value in (overrides or {}).items():
        raw[key] = value if isinstance(value, tuple) else (value, "overrides")
    return build_config(raw)


def build_config(raw: RawConfig) -> Config:
    index = field_index()
    cfg = Config()
    problems: list[str] = []
    for key, (value, where) in raw.items():
        if key not in index:
            problems.append(_unknown_key_message(key, where, index))
            continue
        section, f = index[key]
        if value is None:  # `key: null` keeps the default, as in LLaMA-Factory
            continue
        try:
            coerced = coerce_value(value, f)
        except ValueError as exc:
            problems.append(f"{key}: {exc} (from {where})")
            continue
        setattr(getattr(cfg, section), key, coerced)
    problems += [f"{msg} (from {raw[key][1]})" if key in raw else msg
                 for key, msg in check_values(cfg)]
    if problems:
        raise ConfigError(problems)
    resolve_speed_aliases(cfg)
    return cfg


def _unknown_key_message(key: str, where: str, index: dict) -> str:
    if key in REFUSED_KEYS:
        return refused_message(key, where)
    if key in LLAMA_FACTORY_KEYS_NOT_YET_SUPPORTED or key in llamafactory_keys():
        return (f"{key}: this LLaMA-Factory key is not supported by tunesmith yet (from {where});"
                " remove it, or watch the changelog for it")
    near = difflib.get_close_matches(key, list(index), n=3, cutoff=0.6)
    hint = f"; did you mean {', '.join(near)}?" if near else ""
    return f"unknown key {key!r} (from {where}){hint}"


def coerce_value(value: Any, f: dataclasses.Field) -> Any:
    """Convert a YAML or command-line value to the field's type, or raise ValueError."""
    kind = field_kind(f)
    if kind == "bool":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in {"true", "false", "yes", "no"}:
            return value.lower() in {"true", "yes"}
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        raise ValueError(f"expected true or false, got {value!r}")
    if kind == "int":
        if isinstance(value, bool):
            raise ValueError(f"expected an integer, got {value!r}")
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                pass
        raise ValueError(f"expected an integer, got {value!r}")
    if kind == "float":
        if isinstance(value, bool):
            raise ValueError(f"expected a number, got {value!r}")
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ValueError(f"expected a number, got {value!r}") from None
    if kind == "list":
        if isinstance(value, str):
            return [v.strip() for v in value.split(",") if v.strip()]
        if isinstance(value, list | tuple):
            return [str(v) for v in value]
        raise ValueError(f"expected a list or a comma-separated string, got {value!r}")
    if kind == "dict":
        if isinstance(value, dict):
            return {str(k): v for k, v in value.items()}
        raise ValueError(f"expected a mapping (key: value), got {value!r}")
    # str and Literal fields; YAML turns `false` into a bool, so accept bools for choices
    if isinstance(value, bool) and field_choices(f):
        # YAML 1.1 also reads `no` / `yes` as bools (`eval_strategy: no`)
        for text in (str(value).lower(), "yes" if value else "no"):
            if text in field_choices(f):
                return text
    if not isinstance(value, str | int | float):
        raise ValueError(f"expected a string, got {value!r}")
    return str(value)


def check_values(cfg: Config) -> list[tuple[str, str]]:
    """Range, choice and cross-key checks. Returns (key, message) pairs."""
    out: list[tuple[str, str]] = []
    for key, (section, f) in field_index().items():
        value = getattr(getattr(cfg, section), key)
        msg = _check_field(key, value, f)
        if msg:
            out.append((key, msg))
    t = cfg.training
    if t.bf16 and t.fp16:
        out.append(("fp16", "bf16 and fp16 are both true; choose one"))
    if not t.do_train:
        out.append(("do_train", "do_train is false; `tunesmith train` only trains"))
    if 1 <= cfg.data.val_size and not float(cfg.data.val_size).is_integer():
        out.append(("val_size", f"val_size {cfg.data.val_size} must be a fraction below 1 or "
                                "a whole count of samples"))
    if cfg.data.eval_on_each_dataset and not cfg.data.eval_dataset:
        out.append(("eval_on_each_dataset", "eval_on_each_dataset: true needs eval_dataset "
                    "(the datasets to evaluate one by one); set eval_dataset or remove it"))
    out += speed_conflicts(cfg)
    return out


def _check_field(key: str, value: Any, f: dataclasses.Field) -> str | None:
    choices = field_choices(f)
    if choices and value not in choices and not (value == "" and "" not in choices
                                                 and f.default == ""):
        near = difflib.get_close_matches(str(value), [str(c) for c in choices], n=1)
        hint = f"; did you mean {near[0]}?" if near else ""
        return f"{key}: {value!r} is not one of {', '.join(map(str, choices))}{hint}"
    lo, hi = f.metadata.get("minimum"), f.metadata.get("maximum")
    if isinstance(value, int | float) and not isinstance(value, bool):
        if lo is not None and (value < lo or (f.metadata.get("exclusive_min") and value <= lo)):
            bound = f"> {lo}" if f.metadata.get("exclusive_min") else f">= {lo}"
            return f"{key}: {value!r} is out of range; it must be {bound}"
        if hi is not None and value > hi:
            return f"{key}: {value!r} is out of range; it must be <= {hi}"
    return None


def dump_config(cfg: Config, path: str | Path) -> None:
    """Write the resolved configuration (all keys, defaults included) as YAML."""
    Path(path).write_text(yaml.safe_dump(cfg.to_flat(), sort_keys=False), encoding="utf-8")
