"""Slot templates: LLaMA-Factory's chat templates, kept as data files.

    resources/templates/slots.json        name -> file, kind, stop words, tool format, thinking
    resources/templates/slots/<name>.json one template: slots per part, default system, ...

A template is a set of slot lists, one per part of a conversation (prefix, system, user,
assistant, function call, observation). A slot is text with a {{content}} (or {{idx}})
placeholder, {"token": name} for one token by name, or {"special": "bos_token" |
"eos_token"}. Each text slot is tokenised on its own and each message on its own, which is
why the ids can differ from tokenising the whole rendered text once: slot templates are
encoded by `SlotEncoder` (data/slot_encode.py), never through the text renderer.

The files are generated from LLaMA-Factory itself (tools/lf_templates.py) and checked
against its encoder by the fixtures under tests/fixtures/templates/.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field, replace
from functools import cache
from importlib import resources
from typing import Any, Literal

from tunesmith.errors import ConfigError

log = logging.getLogger(__name__)
Slot = str | dict[str, str]
Kind = Literal["plain", "llama2", "reasoning", "reasoning_close_only"]
PARTS = ("user", "assistant", "system", "function", "observation", "prefix")


def _folder() -> Any:
    return resources.files("tunesmith") / "resources" / "templates"


@cache
def slot_table() -> dict[str, dict[str, Any]]:
    """name -> {file, kind, stop_words, tool_format, thinking, enable_thinking, media}."""
    return json.loads((_folder() / "slots.json").read_text(encoding="utf-8"))


def slot_template_names() -> list[str]:
    return sorted(slot_table())


@dataclass(frozen=True)
class SlotTemplate:
    name: str
    kind: Kind
    slots: dict[str, list[Slot]]
    function_tool_format: str
    tool_format: str | None
    tools_slots: list[Slot] | None
    default_system: str
    stop_words: list[str]
    thought_words: tuple[str, str]
    tool_call_words: tuple[str, str]
    tool_text_lstrip: bool = False
    efficient_eos: bool = False
    replace_eos: bool = False
    enable_thinking: bool | None = True
    preserve_thinking: bool = False
    media: dict[str, Any] = field(default_factory=dict)

    @property
    def reasoning(self) -> bool:
        return self.kind in ("reasoning", "reasoning_close_only")

    def to_json(self) -> str:
        """Canonical text of this template (with its options): the cache keys use it."""
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        return json.dumps(d, sort_keys=True, ensure_ascii=False)

    def with_options(self, default_system: str | None = None, tool_format: str | None = None,
                     enable_thinking: bool | None = None) -> SlotTemplate:
        """Apply the `default_system`, `tool_format` and `enable_thinking` keys with
        LLaMA-Factory's meaning (None leaves the template's own value)."""
        t = self
        if tool_format:
            from tunesmith.data.tool_formats import get_tool_format

            get_tool_format(tool_format)  # unknown names fail here, with the choices
            plain: list[Slot] = ["{{content}}"] if t.efficient_eos else [
                "{{content}}", {"special": "eos_token"}]
            slots = {**t.slots, "function": plain}
            t = replace(t, slots=slots, function_tool_format=tool_format,
                        tool_format=tool_format, tools_slots=None)
        if default_system is not None:
            t = replace(t, default_system=default_system)
        if t.reasoning and enable_thinking is not None:
            t = replace(t, enable_thinking=enable_thinking)
        return t

    @classmethod
    def from_json(cls, text: str) -> SlotTemplate:
        d = json.loads(text)
        d["thought_words"] = tuple(d["thought_words"])
        d["tool_call_words"] = tuple(d["tool_call_words"])
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})


def load_slot_template(name: str) -> SlotTemplate:
    row = slot_table().get(name)
    if row is None:
        raise ConfigError(f"template: {name!r} is not a slot template")
    return SlotTemplate.from_json((_folder() / row["file"]).read_text(encoding="utf-8"))


def fix_tokenizer(template: SlotTemplate, tokenizer: Any) -> list[str]:
    """Give the tokenizer the EOS, pad and stop tokens the template needs, as
    LLaMA-Factory does before encoding (stop words become special tokens, so they are never
    split). Returns the tokens that were new to the vocabulary (the model must grow its
    embeddings for them)."""
    before = len(tokenizer)
    stops = list(template.stop_words)
    if template.replace_eos:
        if not stops:
            raise ConfigError(f"template {template.name!r}: replace_eos needs stop words")
        _set_eos(tokenizer, stops.pop(0))
    if tokenizer.eos_token_id is None:
        _set_eos(tokenizer, "<|endoftext|>")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if stops:
        try:
            tokenizer.add_special_tokens({"additional_special_tokens": stops},
                                         replace_additional_special_tokens=False)
        except TypeError:
            tokenizer.add_special_tokens({"additional_special_tokens": stops})
    added = len(tokenizer) - before
    new = [t for t in [tokenizer.eos_token, *stops]
           if tokenizer.convert_tokens_to_ids(t) >= before] if added else []
    if new:
        log.warning("template %s added %d token(s) to the tokenizer (%s); the model's "
                    "embeddings must be resized for them", template.name, added,
                    ", ".join(new))
    return new


def _set_eos(tokenizer: Any, token: str) -> None:
    if tokenizer.eos_token != token:
        tokenizer.add_special_tokens({"eos_token": token})


def _jinja_slots(slots: list[Slot], tokenizer: Any, placeholder: str = "content") -> str:
    items: list[str] = []

    def lit(text: str) -> None:
        if text:
            items.append("'" + text.replace("'", "\\'") + "'")

    for slot in slots:
        if isinstance(slot, str):
            head, sep, tail = slot.partition("{{content}}")
            lit(head)
            if sep:
                items.append(placeholder)
                lit(tail)
        elif "special" in slot:
            token = getattr(tokenizer, slot["special"], None)
            if token is not None and getattr(tokenizer, slot["special"] + "_id") is not None:
                lit(token)
        else:
            lit(slot["token"])
    return " + ".join(items) or "''"


def jinja_source(t: SlotTemplate, tokenizer: Any) -> str:
    """A Jinja chat template rendering the same text (no tools, no thinking), saved with the
    tuned model so other tools (transformers, vLLM, the export) can render prompts."""
    system = _jinja_slots(t.slots["system"], tokenizer, "system_message")
    user = _jinja_slots(t.slots["user"], tokenizer)
    out = ""
    if t.slots["prefix"]:
        out += "{{ " + _jinja_slots(t.slots["prefix"], tokenizer) + " }}"
    if t.default_system:
        out += "{% set system_message = '" + t.default_system.replace("'", "\\'") + "' %}"
    out += ("{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
            "{% set system_message = messages[0]['content'] %}"
            "{% else %}{% set loop_messages = messages %}{% endif %}")
    if t.kind != "llama2":
        out += "{% if system_message is defined %}{{ " + system + " }}{% endif %}"
    out += "{% for message in loop_messages %}{% set content = message['content'] %}"
    if t.kind == "llama2":
        out += ("{% if loop.index0 == 0 and system_message is defined %}"
                "{% set content = " + system + " + message['content'] %}{% endif %}")
    out += ("{% if message['role'] == 'user' %}{{ " + user + " }}"
            "{% elif message['role'] == 'assistant' %}{{ "
            + _jinja_slots(t.slots["assistant"], tokenizer) + " }}{% endif %}{% endfor %}")
    return out
