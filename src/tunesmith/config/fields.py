"""`opt`: a config field with its documentation and bounds (shared by every section module)."""

from __future__ import annotations

from dataclasses import field
from typing import Any


def opt(default: Any, help: str, *, minimum: float | None = None, maximum: float | None = None,
        exclusive_min: bool = False, choices: tuple[str, ...] | None = None,
        advanced: bool = False) -> Any:
    """A config field with its documentation and bounds."""
    meta = {"help": help, "minimum": minimum, "maximum": maximum,
            "exclusive_min": exclusive_min, "choices": choices, "advanced": advanced}
    if isinstance(default, list | dict):
        return field(default_factory=lambda d=default: type(d)(d), metadata=meta)
    return field(default=default, metadata=meta)
