"""Tools and image parts in the chat API, driven by the official openai client.

A tiny random model cannot decide to call a tool, so the model's answers here are scripted
(ScriptedEngine); the prompt rendering (the qwen template's tool format), the parsing of
the answer, the OpenAI response shapes and the client round trip are the real ones.
"""

from __future__ import annotations

import json

import openai
import pytest

from server_thread import running_server
from tunesmith.infer.engine import Chunk, HFEngine
from tunesmith.serve.app import ServerSettings, create_app
from tunesmith.serve.tools import ToolStreamSplitter, parse_tool_calls

NAME = "tiny-tools"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


class ScriptedEngine:
    """The real engine (tokenizer, template, context checks) answering scripted texts."""

    def __init__(self, engine: HFEngine, answers: list[str]):
        self.engine, self.answers, self.prompts = engine, list(answers), []

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def encode_chat(self, messages, tools=None):
        self.prompts.append(self.engine.renderer.prompt_text(messages, tools))
        return self.engine.encode_chat(messages, tools)

    def stream_batch(self, prompts, params, cancelled):
        for i in range(len(prompts)):
            answer = self.answers.pop(0)
            yield i, Chunk(answer)
            yield i, Chunk("", "stop", len(self.engine.tokenizer(answer)["input_ids"]))


@pytest.fixture
def served(tiny_llama_dir, monkeypatch):
    """A server whose model answers the scripted texts (through the generate worker)."""
    import tunesmith.infer.batcher as batcher
    from tunesmith.errors import UnsupportedModelError

    def refuse(config, dtype, length=0):
        raise UnsupportedModelError("scripted answers (test)")

    monkeypatch.setattr(batcher, "cache_shape", refuse)
    engine = HFEngine(str(tiny_llama_dir), template="qwen")

    def serve(answers: list[str]):
        scripted = ScriptedEngine(engine, answers)
        return scripted, running_server(create_app(scripted, ServerSettings(NAME)))

    return serve


def test_tool_call_round_trip_with_the_openai_client(served):
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    scripted, server = served([call, "It is 18 degrees in Paris.", "Let me look.\n" + call])
    with server as url:
        client = openai.OpenAI(base_url=url, api_key="x", max_retries=0, timeout=60)
        first = client.chat.completions.create(model=NAME, messages=ASK, tools=[WEATHER],
                                               tool_choice="auto")
        choice = first.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        (tc,) = choice.message.tool_calls
        assert tc.function.name == "get_weather"
        assert json.loads(tc.function.arguments) == {"city": "Paris"}
        assert '"name": "get_weather"' in scripted.prompts[0]  # tools rendered by qwen.jinja
        follow = [*ASK, choice.message.model_dump(exclude_none=True),
                  {"role": "tool", "tool_call_id": tc.id, "content": "18 degrees"}]
        second = client.chat.completions.create(model=NAME, messages=follow, tools=[WEATHER])
        assert second.choices[0].message.content == "It is 18 degrees in Paris."
        assert second.choices[0].finish_reason == "stop"
        assert "<tool_response>\n18 degrees\n</tool_response>" in scripted.prompts[1]
        assert '{"name": "get_weather", "arguments": {"city": "Paris"}}' in scripted.prompts[1]
        stream = client.chat.completions.create(model=NAME, messages=ASK, tools=[WEATHER],
                                                stream=True)
        chunks = list(stream)
    deltas = [d for c in chunks for d in (c.choices[0].delta.tool_calls or [])]
    assert [d.function.name for d in deltas] == ["get_weather"]
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "Let me look.\n"
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_forced_tool_choice_and_images_on_a_text_model_are_400(served):
    scripted, server = served([])
    with server as url:
        client = openai.OpenAI(base_url=url, api_key="x", max_retries=0, timeout=60)
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(model=NAME, messages=ASK, tools=[WEATHER],
                                           tool_choice="required")
        assert info.value.body["param"] == "tool_choice"
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(model=NAME, messages=ASK, tools=[WEATHER],
                                           parallel_tool_calls=False)
        assert info.value.body["param"] == "parallel_tool_calls"
        image = [{"role": "user", "content": [
            {"type": "text", "text": "What is this?"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]}]
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(model=NAME, messages=image)
        assert info.value.body["code"] == "images_not_supported"
        assert NAME in info.value.message and info.value.body["param"] == "messages.0.content"
        bad = [*ASK, {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
                      "function": {"name": "get_weather", "arguments": "{city"}}]}]
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(model=NAME, messages=bad)
        assert "arguments" in info.value.body["param"]
    assert scripted.prompts == []  # nothing reached the model


def test_tool_call_formats_are_parsed_and_bad_blocks_stay_content():
    hermes = 'Let me check.\n<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>'
    assert parse_tool_calls(hermes) == ("Let me check.", [{"name": "f", "arguments": {"x": 1}}])
    two = '[TOOL_CALLS][{"name": "f", "arguments": {}}, {"name": "g", "arguments": {"y": 2}}]'
    assert [c["name"] for c in parse_tool_calls(two)[1]] == ["f", "g"]
    assert parse_tool_calls('{"name": "f", "parameters": {"x": 1}}') == (
        "", [{"name": "f", "arguments": {"x": 1}}])
    broken = "<tool_call>{not json}</tool_call>"
    assert parse_tool_calls(broken) == (broken, [])
    assert parse_tool_calls("The answer is {1, 2}.") == ("The answer is {1, 2}.", [])
    assert parse_tool_calls('{"city": "Paris"}') == ('{"city": "Paris"}', [])


def test_image_parts_reach_a_vision_engine_as_placeholders_and_images():
    from tunesmith.serve.protocol import ChatCompletionRequest

    req = ChatCompletionRequest.model_validate({"model": NAME, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "What is this?"},
                                     {"type": "image_url", "image_url": {"url": "u.png"}}]},
        {"role": "assistant", "content": [{"type": "text", "text": "A cat."}]}]})
    conv = req.conversation()
    # the data layer's shape: an <image> placeholder where each image part stands, the
    # images listed in order (infer/vision.encode_vision_prompt expands them)
    assert conv[0]["content"] == "What is this?<image>" and conv[0]["images"] == ["u.png"]
    assert conv[1]["content"] == "A cat." and "images" not in conv[1]


def test_streamed_text_is_sent_until_a_call_may_begin():
    def run(pieces):
        split = ToolStreamSplitter()
        shown = [split.add(p) for p in pieces]
        return shown, split.finish()

    shown, (tail, calls) = run(["Sunny ", "<b>warm</b> ", "<tool", '_call>{"name": "f", ',
                                '"arguments": {}}</tool_call>'])
    assert shown == ["Sunny ", "<b>warm</b> ", "", "", ""] and tail == ""
    assert calls == [{"name": "f", "arguments": {}}]
    shown, (tail, calls) = run([" {", '"name": "f", "parameters": {"x": 1}}'])
    assert shown == [" ", ""] and calls == [{"name": "f", "arguments": {"x": 1}}]
    shown, (tail, calls) = run(['x <b> y <tool_call>{"name": "g", "arguments": {}}'])
    assert shown == ["x <b> y "] and [c["name"] for c in calls] == ["g"]
    shown, (tail, calls) = run(["a [1, 2", "] b"])  # a bracket that is no call marker
    assert "".join(shown) + tail == "a [1, 2] b" and calls == []
    shown, (tail, calls) = run(["{not json"])
    assert shown == [""] and (tail, calls) == ("{not json", [])
