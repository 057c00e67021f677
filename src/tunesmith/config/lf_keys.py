"""LLaMA-Factory's keys (resources/llamafactory_keys.json, extracted from its hparams by
tools/lf_keys_extract.py) and the status of each in tunesmith: implemented (a schema
field), refused (config/refused.py, with the reason) or not yet (the loader says so)."""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Literal

from tunesmith.config.refused import REFUSED_KEYS
from tunesmith.config.schema import field_index

Status = Literal["implemented", "refused", "not yet"]


@cache
def llamafactory_keys() -> dict[str, dict]:
    """key -> {group, declared_in, help} for every LLaMA-Factory 0.9.5 config key."""
    text = (resources.files("tunesmith") / "resources" / "llamafactory_keys.json").read_text(
        encoding="utf-8")
    return json.loads(text)["keys"]


def key_status(key: str) -> tuple[Status, str]:
    """(status, note): the schema section and help, the refusal reason, or an empty note."""
    index = field_index()
    if key in index:
        section, f = index[key]
        return "implemented", f"{section}: {f.metadata.get('help', '')}"
    if key in REFUSED_KEYS:
        return "refused", REFUSED_KEYS[key]
    return "not yet", ""
