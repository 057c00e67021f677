"""Chat templates: render a conversation to text plus the character spans to train on.

The trained spans come from the structure of the conversation, not from searching the
text: the span of assistant turn i is the text between the rendering of messages[:i] with
the generation prompt and the rendering of messages[:i+1]. Rendering is checked to be
prefix-stable (each prefix renders as a prefix of the whole), otherwise the template
cannot be trained on and we say so.

Templates are Jinja sources: the tokenizer's own by default, or a built-in data file
(resources/templates/<name>.jinja) chosen with `template:`. LLaMA-Factory's template names
are encoded by slot templates instead (data/slot_renderer.py, `make_renderer`); this module
gives them a Jinja text only for saving with the model and for inference.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from importlib import resources
from typing import Any

import jinja2
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from tunesmith.data.conversation import Conversation
from tunesmith.errors import ConfigError, DataError

Span = tuple[int, int]


def jinja_template_names() -> list[str]:
    folder = resources.files("tunesmith") / "resources" / "templates"
    return sorted(p.name.removesuffix(".jinja") for p in folder.iterdir()
                  if p.name.endswith(".jinja"))


def builtin_template_names() -> list[str]:
    """Every name `template:` accepts: LLaMA-Factory's template names (slot templates,
    data/slot_template.py) and the Jinja files of resources/templates/."""
    from tunesmith.data.slot_template import slot_template_names

    return sorted(set(jinja_template_names()) | set(slot_template_names()))


def load_template_source(name: str, tokenizer: Any) -> tuple[str, str]:
    """(name, jinja source) for `template:`; empty name means the tokenizer's own."""
    if not name:
        source = getattr(tokenizer, "chat_template", None)
        if isinstance(source, dict):
            source = source.get("default")
        if not source:
            raise ConfigError("template: the tokenizer has no chat template of its own; set "
                              f"template to one of {', '.join(builtin_template_names())}")
        return "tokenizer", source
    names = builtin_template_names()
    if name not in jinja_template_names() and name in names:
        # a LLaMA-Factory name without a Jinja file: the Jinja text its slots render
        from tunesmith.data.slot_template import jinja_source, load_slot_template

        return name, jinja_source(load_slot_template(name), tokenizer)
    if name not in names:
        import difflib

        near = difflib.get_close_matches(name, names, n=1)
        hint = f"; did you mean {near[0]}?" if near else ""
        raise ConfigError(f"template: unknown template {name!r}; built-in templates are "
                          f"{', '.join(names)}{hint}")
    path = resources.files("tunesmith") / "resources" / "templates" / f"{name}.jinja"
    return name, path.read_text(encoding="utf-8")


class _GenerationTag(Extension):
    """Accept HF's `{% generation %}...{% endgeneration %}` markers as plain blocks."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body, lineno=lineno)


def _raise(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: Any = None, sort_keys: bool = False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def compile_template(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_GenerationTag, loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(source)


@dataclass
class RenderedText:
    text: str
    assistant_spans: list[Span]  # character spans of every assistant turn, in order


class ChatRenderer:
    """Renders conversations with one chat template; checked against the tokenizer's own
    `apply_chat_template` on first use so the fast path cannot drift from it."""

    def __init__(self, name: str, source: str, tokenizer: Any):
        self.name, self.source, self.tokenizer = name, source, tokenizer
        self._template = compile_template(source)
        self._specials = {k: v for k, v in (tokenizer.special_tokens_map or {}).items()
                          if isinstance(v, str)}
        self._checked = False
        self._placer: Any = None

    @property
    def placer(self) -> Any:
        """The TokenPlacer for this renderer's tokenizer (built on first use)."""
        if self._placer is None:
            from tunesmith.data.tokens import TokenPlacer

            self._placer = TokenPlacer(self.tokenizer)
        return self._placer

    def render_messages(self, messages: list[dict[str, Any]], tools: list | None = None,
                        add_generation_prompt: bool = False) -> str:
        try:
            return self._template.render(messages=messages, tools=tools,
                                         add_generation_prompt=add_generation_prompt,
                                         **self._specials)
        except jinja2.exceptions.TemplateError as exc:
            raise DataError(f"chat template {self.name!r} refused the conversation: {exc}"
                            ) from None

    def render(self, conv: Conversation) -> RenderedText:
        msgs = conv.dicts()
        full = self.render_messages(msgs, conv.tools)
        if not self._checked:
            self._check_against_tokenizer(msgs, conv.tools, full)
        spans: list[Span] = []
        for i, m in enumerate(msgs):
            if m["role"] != "assistant":
                continue
            before = self.render_messages(msgs[:i], conv.tools, add_generation_prompt=True)
            upto = full if i == len(msgs) - 1 else self.render_messages(msgs[: i + 1],
                                                                         conv.tools)
            if not (full.startswith(upto) and upto.startswith(before)):
                raise DataError(f"{conv.source}: chat template {self.name!r} is not prefix-"
                                "stable (it rewrites earlier turns when later ones are added), "
                                "so trained tokens cannot be located; choose another template")
            spans.append((len(before), len(upto)))
        return RenderedText(full, spans)

    def _check_against_tokenizer(self, msgs: list[dict], tools: list | None, ours: str) -> None:
        theirs = self.tokenizer.apply_chat_template(msgs, tools=tools, tokenize=False,
                                                    chat_template=self.source)
        if theirs != ours:
            # Our Jinja environment differs from transformers' for this template: use theirs.
            self.render_messages = self._render_with_tokenizer  # type: ignore[method-assign]
        self._checked = True

    def _render_with_tokenizer(self, messages: list[dict[str, Any]], tools: list | None = None,
                               add_generation_prompt: bool = False) -> str:
        if not messages:
            return ""
        return self.tokenizer.apply_chat_template(
            messages, tools=tools, tokenize=False, chat_template=self.source,
            add_generation_prompt=add_generation_prompt)

    def prompt_text(self, messages: list[dict[str, Any]], tools: list | None = None) -> str:
        """Text to feed for generation after `messages` (inference), with `tools` (OpenAI
        function specs) rendered in the template's tool format."""
        return self.render_messages(messages, tools, add_generation_prompt=True)
