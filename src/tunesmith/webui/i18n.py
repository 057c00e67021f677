"""The web UI in several languages: every label, help text, button and message.

    resources/i18n/webui.yaml      id -> {en: ..., zh: ...}   (labels, buttons, messages)
    resources/i18n/fields.zh.yaml  config key -> Chinese help (English: config/schema.py)

Builders create components through a `Translator`: a text argument written "@id" (or
"@field:KEY" for a config key's help) is shown in English first and remembered, so the
language switch can send every component its text in the chosen language.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from typing import Any

import yaml

from tunesmith.config.schema import field_index

LANGUAGES: tuple[tuple[str, str], ...] = (("English", "en"), ("中文", "zh"))
LANGUAGE_CODES = tuple(code for _, code in LANGUAGES)
DEFAULT_LANGUAGE = "en"
TRANSLATED_ATTRS = ("label", "info", "value", "placeholder")
# Sets the switch from the browser's language when the page loads.
BROWSER_LANGUAGE_JS = "() => (navigator.language || 'en').toLowerCase().startsWith('zh') ? 'zh' : 'en'"


def _i18n_folder() -> Any:
    return resources.files("tunesmith") / "resources" / "i18n"


@lru_cache(maxsize=1)
def ui_strings() -> dict[str, dict[str, str]]:
    text = (_i18n_folder() / "webui.yaml").read_text("utf-8")
    return yaml.safe_load(text)


@lru_cache(maxsize=1)
def field_help_zh() -> dict[str, str]:
    path = _i18n_folder() / "fields.zh.yaml"
    return yaml.safe_load(path.read_text("utf-8")) or {}


def text(sid: str, lang: str = DEFAULT_LANGUAGE, **values: Any) -> str:
    """The string `sid` in `lang` ({name} placeholders filled from `values`); a config
    key's help when `sid` is "field:KEY"."""
    if sid.startswith("field:"):
        return field_help(sid.removeprefix("field:"), lang)
    entry = ui_strings()[sid]
    s = entry.get(lang) or entry[DEFAULT_LANGUAGE]
    return s.format(**values) if values else s


def field_help(key: str, lang: str = DEFAULT_LANGUAGE) -> str:
    english = field_index()[key][1].metadata.get("help", "")
    if lang == "zh":
        return field_help_zh().get(key, english)
    return english


def missing_translations() -> list[str]:
    """Ids (and config keys) that lack a Chinese text: the tests require none."""
    missing = [f"ui:{sid}" for sid, entry in ui_strings().items()
               if not entry.get("zh") or not entry.get("en")]
    missing += [f"field:{k}" for k in field_index() if not field_help_zh().get(k)]
    return missing


class Translator:
    """Creates gradio components with translatable texts and updates them on a switch."""

    def __init__(self) -> None:
        self._bound: list[tuple[Any, dict[str, str]]] = []

    def __call__(self, cls: Any, *args: Any, **kwargs: Any) -> Any:
        ids = {a: kwargs[a][1:] for a in TRANSLATED_ATTRS
               if isinstance(kwargs.get(a), str) and kwargs[a].startswith("@")}
        for attr, sid in ids.items():
            kwargs[attr] = text(sid)
        component = cls(*args, **kwargs)
        if ids:
            self._bound.append((component, ids))
        return component

    def components(self) -> list[Any]:
        return [c for c, _ in self._bound]

    def updates(self, lang: str) -> list[Any]:
        import gradio as gr

        lang = lang if lang in LANGUAGE_CODES else DEFAULT_LANGUAGE
        return [gr.update(**{attr: text(sid, lang) for attr, sid in ids.items()})
                for _, ids in self._bound]
