"""The training form, generated from the config schema (the one source of keys).

Every field of every section of `config/schema.py` becomes one form field, in schema
order, with the schema's help text, choices and bounds; fields marked `advanced` go into a
folded group. Form values are turned back into a config by the same loader the CLI uses,
so the form cannot accept what `tunesmith train` would refuse, nor name a key it lacks.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import yaml

from tunesmith.config.loader import build_config
from tunesmith.config.schema import Config, field_choices, field_index, field_kind
from tunesmith.errors import ConfigError


@dataclass(frozen=True)
class FieldSpec:
    """What the form needs to know about one config key."""

    key: str
    section: str
    kind: str  # bool, int, float, str, list, dict
    default: Any
    help: str
    choices: tuple[str, ...] | None
    minimum: float | None
    maximum: float | None
    advanced: bool


def _default(f: dataclasses.Field) -> Any:
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return f.default_factory()  # type: ignore[misc]
    return f.default


def form_fields() -> list[FieldSpec]:
    """One FieldSpec per config key, in schema order."""
    return [FieldSpec(key, section, field_kind(f), _default(f), f.metadata.get("help", ""),
                      field_choices(f), f.metadata.get("minimum"), f.metadata.get("maximum"),
                      bool(f.metadata.get("advanced")))
            for key, (section, f) in field_index().items()]


def widget_value(spec: FieldSpec, value: Any) -> Any:
    """A config value as the form shows it (lists as comma-separated text, dicts as YAML)."""
    if spec.kind == "list":
        return ", ".join(value) if isinstance(value, list) else str(value or "")
    if spec.kind == "dict":
        return yaml.safe_dump(value, default_flow_style=True).strip() if value else ""
    return value


def _form_value(spec: FieldSpec, value: Any) -> Any:
    """A form value -> a raw config value for the loader (which coerces and checks it)."""
    if value is None:
        return None
    if spec.kind == "dict":
        if isinstance(value, dict):
            return value
        text = str(value).strip()
        if not text:
            return {}
        try:
            return yaml.safe_load(text)
        except yaml.YAMLError:
            raise ConfigError(f"{spec.key}: {text!r} is not a YAML mapping such as "
                              "{name: Tuney}") from None
    if spec.kind == "list" and isinstance(value, list):
        return [str(v) for v in value]
    if spec.kind == "int" and isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def form_to_config(values: dict[str, Any]) -> tuple[dict[str, Any], Config]:
    """Form values (key -> value) -> (the keys that differ from the defaults, Config).

    Raises ConfigError listing every problem at once, as the CLI does.
    """
    specs = {s.key: s for s in form_fields()}
    unknown = sorted(set(values) - set(specs))
    if unknown:
        raise ConfigError(f"form: unknown key(s) {', '.join(unknown)}")
    raw = {k: (_form_value(specs[k], v), "web form") for k, v in values.items()}
    cfg = build_config(raw)
    flat = cfg.to_flat()
    changed = {k: v for k, v in flat.items() if k in values and v != specs[k].default}
    return changed, cfg


def config_yaml(flat: dict[str, Any]) -> str:
    return yaml.safe_dump(flat, sort_keys=False, allow_unicode=True)
