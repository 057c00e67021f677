"""Every built-in template: token ids equal `apply_chat_template`, and the loss mask covers
exactly the assistant turns (found here independently, by each template's own markers)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from tunesmith.data.conversation import Conversation, Message
from tunesmith.data.encode import IGNORE_INDEX, EncodeOptions, encode_conversations
from tunesmith.data.template import ChatRenderer, builtin_template_names, load_template_source

EOS = "<|im_end|>"  # the tiny tokenizer's eos_token
# template -> (regex of what precedes an answer, text that ends an answer)
MARKERS = {
    "chatml": (r"<\|im_start\|>assistant\n", "<|im_end|>\n"),
    "qwen": (r"<\|im_start\|>assistant\n", "<|im_end|>\n"),
    "llama3": (r"<\|start_header_id\|>assistant<\|end_header_id\|>\n\n", "<|eot_id|>"),
    "mistral": (r"\[/INST\]|\[/TOOL_RESULTS\]", EOS),
    "gemma": (r"<start_of_turn>model\n", "<end_of_turn>\n"),
    "phi": (r"<\|assistant\|>\n", "<|end|>\n"),
    "alpaca": (r"### Response:\n", EOS + "\n\n"),
    "default": (r"Assistant:\n", EOS + "\n"),
}
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
CALL = [{"type": "function", "function": {"name": "get_weather",
                                          "arguments": {"city": "Paris"}}}]

CONVERSATIONS = {
    "multi_turn": [Message("user", "What is 2 + 2?"), Message("assistant", "It is 4."),
                   Message("user", "And 3 + 3?"), Message("assistant", "That makes 6.")],
    "system": [Message("system", "You are terse."), Message("user", "Hello there"),
               Message("assistant", "Hi.")],
    "tool_call": [Message("user", "Weather in Paris?"),
                  Message("assistant", "", CALL),
                  Message("tool", '{"temp": 21}'),
                  Message("assistant", "It is 21 degrees in Paris.")],
    "unicode": [Message("user", "Ça va? 你好，世界 🙂"),
                Message("assistant", "Très bien! こんにちは Привет 🙂")],
}


def _apply(tokenizer, messages, tools, source):
    out = tokenizer.apply_chat_template(messages, tools=tools, chat_template=source,
                                        tokenize=True, add_generation_prompt=False)
    if not isinstance(out, list):  # transformers 5 may return a BatchEncoding
        out = out["input_ids"]
    return list(out)


def _expected_spans(text: str, template: str) -> list[tuple[int, int]]:
    head, end = MARKERS[template]
    spans = []
    for m in re.finditer(head, text):
        stop = text.index(end, m.end()) + len(end)
        spans.append((m.end(), stop))
    return spans


def test_every_named_template_is_built_in():
    assert set(MARKERS) <= set(builtin_template_names())


@pytest.mark.parametrize("template", sorted(MARKERS))
@pytest.mark.parametrize("kind", sorted(CONVERSATIONS))
def test_template_ids_and_mask(tiny_tokenizer, template, kind):
    name, source = load_template_source(template, tiny_tokenizer)
    renderer = ChatRenderer(name, source, tiny_tokenizer)
    tools = TOOLS if kind == "tool_call" else None
    conv = Conversation(CONVERSATIONS[kind], tools=tools, source="test:1")
    samples, _, stats = encode_conversations([conv], renderer, tiny_tokenizer,
                                             EncodeOptions(cutoff_len=4096))
    assert stats.bad == [] and len(samples) == 1
    assert "render_messages" not in vars(renderer), "fell back to the slow tokenizer path"
    assert renderer.placer.byte_lengths is not None, "byte-level placement switched itself off"
    sample = samples[0]
    assert sample.input_ids.tolist() == _apply(tiny_tokenizer, conv.dicts(), tools, source)

    text = tiny_tokenizer.apply_chat_template(conv.dicts(), tools=tools, chat_template=source,
                                              tokenize=False)
    spans = _expected_spans(text, template)
    n_assistant = sum(m.role == "assistant" for m in conv.messages)
    assert len(spans) == n_assistant
    enc = tiny_tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    want = np.array([any(s < hi and e > lo for lo, hi in spans)
                     for s, e in enc["offset_mapping"]])
    got = sample.labels != IGNORE_INDEX
    assert got.tolist() == want.tolist()
    trained_text = tiny_tokenizer.decode(sample.input_ids[got])
    for m in conv.messages:
        if m.role == "assistant" and m.content:
            assert m.content in trained_text
        if m.role == "user":
            assert m.content not in trained_text


def test_mask_history_and_train_on_prompt(tiny_tokenizer):
    name, source = load_template_source("chatml", tiny_tokenizer)
    renderer = ChatRenderer(name, source, tiny_tokenizer)
    conv = Conversation(CONVERSATIONS["multi_turn"], source="t:1")

    def trained(**kw):
        s, _, _ = encode_conversations([conv], renderer, tiny_tokenizer,
                                       EncodeOptions(cutoff_len=4096, **kw))
        return tiny_tokenizer.decode(s[0].input_ids[s[0].labels != IGNORE_INDEX])

    assert "It is 4." in trained() and "That makes 6." in trained()
    last_only = trained(mask_history=True)
    assert "It is 4." not in last_only and "That makes 6." in last_only
    everything = trained(train_on_prompt=True)
    assert "What is 2 + 2?" in everything and "It is 4." in everything


def test_unknown_template_suggests_nearest(tiny_tokenizer):
    from tunesmith.errors import ConfigError

    with pytest.raises(ConfigError, match="did you mean llama3"):
        load_template_source("llama-3", tiny_tokenizer)
