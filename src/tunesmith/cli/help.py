"""`tunesmith train --help`: every key, generated from the schema."""

from __future__ import annotations

from tunesmith.config.schema import field_choices, field_index


def config_help() -> str:
    lines = ["usage: tunesmith train CONFIG.yaml [key=value ...] [--key value ...]", ""]
    section = None
    for key, (sec, f) in field_index().items():
        if sec != section:
            lines.append(f"[{sec}]")
            section = sec
        choices = field_choices(f)
        extra = f" (one of: {', '.join(map(str, choices))})" if choices else ""
        default = f.default if not callable(f.default_factory) else f.default_factory()  # type: ignore[misc]
        lines.append(f"  {key} = {default!r}{extra}\n      {f.metadata['help']}")
    return "\n".join(lines)
