"""The training-side face of a slot template: conversations -> samples, with tunesmith's
truncation counts and bad-row reports around LLaMA-Factory's exact encoding.

`make_renderer` picks the renderer for `template:`: a LLaMA-Factory template name gets a
SlotRenderer (ids equal LLaMA-Factory's), anything else the Jinja ChatRenderer (the
tokenizer's own template, or a Jinja file of resources/templates/).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tunesmith.config.template_section import TemplateConfig
from tunesmith.data.conversation import Conversation
from tunesmith.data.slot_encode import (
    SampleOptions,
    SlotEncoder,
    Turns,
    build_sample,
    to_turns,
)
from tunesmith.data.slot_template import (
    SlotTemplate,
    fix_tokenizer,
    load_slot_template,
    slot_table,
)
from tunesmith.errors import ConfigError

PROMPT_ROLES, ANSWER_ROLES = ("user", "observation"), ("assistant", "function")


class SlotRenderer:
    """Encodes conversations with one LLaMA-Factory template (see data/slot_encode.py)."""

    def __init__(self, template: SlotTemplate, tokenizer: Any, source: str):
        self.template, self.tokenizer = template, tokenizer
        self.name = template.name
        self.source = source  # a Jinja rendering of the template, saved with the model
        self.added_tokens = fix_tokenizer(template, tokenizer)
        self.encoder = SlotEncoder(template, tokenizer)

    @property
    def cache_key(self) -> str:
        return self.template.to_json()

    def shape_problem(self, turns: Turns) -> str | None:
        """Why LLaMA-Factory's turn structure does not fit, or None."""
        roles = [r for r, _ in turns.messages]
        if len(roles) % 2:
            return "the conversation does not end with an assistant answer"
        for i, role in enumerate(roles):
            want = PROMPT_ROLES if i % 2 == 0 else ANSWER_ROLES
            if role not in want:
                return (f"message {i + 1} is {role!r} where the template expects one of "
                        f"{', '.join(want)} (prompts and answers must alternate)")
        return None

    def encode(self, convs: list[Conversation], opts: Any, stats: Any
               ) -> list[tuple[Conversation, np.ndarray, np.ndarray]]:
        """(conversation, ids, labels) of every conversation that fits; problems go to
        stats.bad, truncation is counted in stats."""
        if opts.train_on_prompt and self.template.efficient_eos:
            raise ConfigError(f"train_on_prompt: template {self.name!r} ends answers with the "
                              "next prompt's first token (efficient EOS), so its prompts "
                              "cannot be trained on; set train_on_prompt: false")
        kept: list[tuple[Conversation, Turns]] = []
        for conv in convs:
            turns = to_turns(conv)
            problem = self.shape_problem(turns)
            if problem:
                stats.bad.append((conv.source, f"template {self.name!r}: {problem}"))
            else:
                kept.append((conv, turns))
        pairs = self._pairs(kept, opts, stats)
        o = SampleOptions(opts.cutoff_len, opts.train_on_prompt, opts.mask_history,
                          self.template.efficient_eos, self.tokenizer.eos_token_id)
        out = []
        for conv, conv_pairs in pairs:
            full = sum(len(s) + len(a) for s, a in conv_pairs) + o.efficient_eos
            if full > opts.cutoff_len and opts.truncation == "error":
                stats.bad.append((conv.source, f"sample has {full} tokens, more than "
                                  f"cutoff_len {opts.cutoff_len} (truncation: error); raise "
                                  "cutoff_len or set truncation: truncate_prompt or drop"))
                continue
            if full > opts.cutoff_len and opts.truncation == "drop":
                stats.dropped_too_long.append(conv.source)
                continue
            ids, labels, cut_answer = build_sample(conv_pairs, o)
            if full > opts.cutoff_len:
                if cut_answer:
                    stats.truncated_response += 1
                else:
                    stats.truncated_prompt += 1
            out.append((conv, ids, labels))
        return out

    def _pairs(self, kept: list[tuple[Conversation, Turns]], opts: Any, stats: Any
               ) -> list[tuple[Conversation, list]]:
        try:
            encoded = self.encoder.encode_pairs([t for _, t in kept], opts.mask_history)
            return [(c, p) for (c, _), p in zip(kept, encoded, strict=True)]
        except (ValueError, KeyError, TypeError):
            pass  # one conversation broke the batch: encode one by one to name it
        out = []
        for conv, turns in kept:
            try:
                out.append((conv, self.encoder.encode_pairs([turns], opts.mask_history)[0]))
            except (ValueError, KeyError, TypeError) as exc:
                stats.bad.append((conv.source, f"template {self.name!r} cannot write this "
                                  f"conversation: {type(exc).__name__}: {exc}"))
        return out

    def prompt_text(self, messages: list[dict[str, Any]]) -> str:
        """Text of the prompt for generation after `messages` (slots as text)."""
        from tunesmith.data.conversation import Message

        conv = Conversation([Message(m["role"], m["content"]) for m in messages]
                            + [Message("assistant", "")])
        els = self.encoder.elements(to_turns(conv))
        return "".join(self._element_text(e) for msg in els[:-1] for e in msg)

    def _element_text(self, e: Any) -> str:
        if isinstance(e, str):
            return e
        if "token" in e:
            return e["token"]
        return getattr(self.tokenizer, e["special"], None) or ""


def make_renderer(name: str, source: str, tokenizer: Any, keys: TemplateConfig | None = None,
                  media: bool = False) -> Any:
    """The renderer for `template: name` (source: from load_template_source). With media
    (a vision-language model) the Jinja renderer is used, which expands image and video
    placeholders; slot templates encode text only."""
    from tunesmith.data.template import ChatRenderer

    keys = keys or TemplateConfig()
    if name not in slot_table() or media:
        if keys.default_system or keys.tool_format:
            raise ConfigError(f"default_system / tool_format: only LLaMA-Factory template "
                              f"names take them, and template is {name or 'empty'!r} (the "
                              "tokenizer's own Jinja template); set template to one of "
                              "LLaMA-Factory's names, e.g. qwen3")
        return ChatRenderer(name, source, tokenizer)
    template = load_slot_template(name).with_options(
        default_system=keys.default_system or None, tool_format=keys.tool_format or None,
        enable_thinking=keys.enable_thinking)
    if keys.preserve_thinking and template.reasoning:
        from dataclasses import replace

        template = replace(template, preserve_thinking=True)
    return SlotRenderer(template, tokenizer, source)


def check_added_tokens(renderer: Any, n_embeddings: int) -> None:
    """Refuse a template whose stop words or EOS are not in the model's vocabulary (ids past
    the embedding matrix would crash the first step)."""
    new = [t for t in getattr(renderer, "added_tokens", [])
           if renderer.tokenizer.convert_tokens_to_ids(t) >= n_embeddings]
    if new:
        raise ConfigError(f"template: {renderer.name!r} needs the token(s) {', '.join(new)}, "
                          f"which the model's vocabulary ({n_embeddings} rows) lacks; choose "
                          "the template made for this model (or leave template empty to use "
                          "the tokenizer's own)")
