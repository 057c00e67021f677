"""The OpenAI-compatible server, driven by the official `openai` client over loopback."""

from __future__ import annotations

import json
import threading
import time

import httpx
import openai
import pytest

from server_thread import running_server
from tunesmith.errors import UnsupportedModelError
from tunesmith.infer.engine import GenerationParams, HFEngine
from tunesmith.serve.app import ServerSettings, create_app

NAME = "tiny-served"
KEY = "s3cret-key"
HELLO = [{"role": "user", "content": "Who are you?"}]


@pytest.fixture(scope="module")
def engine(tiny_llama_dir) -> HFEngine:
    return HFEngine(str(tiny_llama_dir))


@pytest.fixture(scope="module")
def base_url(engine):
    with running_server(create_app(engine, ServerSettings(NAME))) as url:
        yield url


@pytest.fixture(scope="module")
def client(base_url) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=60)


def greedy(engine: HFEngine, messages, n_tokens: int = 10) -> str:
    return engine.generate(messages, GenerationParams(n_tokens, temperature=0))


def test_models_reports_the_served_name(client):
    assert [m.id for m in client.models.list().data] == [NAME]
    assert client.models.retrieve(NAME).id == NAME
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("someone-else")


def test_chat_matches_the_engine_and_counts_usage(client, engine):
    r = client.chat.completions.create(model=NAME, messages=HELLO, max_tokens=10,
                                       temperature=0)
    assert r.model == NAME and r.object == "chat.completion"
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == greedy(engine, HELLO)
    assert r.usage.prompt_tokens == len(engine.encode_chat(HELLO))
    assert 1 <= r.usage.completion_tokens <= 10
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    if r.usage.completion_tokens == 10:
        assert r.choices[0].finish_reason == "length"


def test_streaming_equals_non_streaming_and_reports_usage(client, engine):
    stream = client.chat.completions.create(model=NAME, messages=HELLO, max_tokens=10,
                                            temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == greedy(engine, HELLO)
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and
              c.choices[0].finish_reason]
    assert len(finals) == 1
    assert chunks[-1].choices == [] and chunks[-1].usage.prompt_tokens == len(
        engine.encode_chat(HELLO))
    assert all(c.usage is None for c in chunks[:-1])


def test_concurrent_requests_get_their_own_answers(client, engine):
    from concurrent.futures import ThreadPoolExecutor

    convs = [[{"role": "user", "content": f"Question {i}: what is {i} + {i}?"}]
             for i in range(8)]

    def ask(conv):
        r = client.chat.completions.create(model=NAME, messages=conv, max_tokens=10,
                                           temperature=0)
        return r.choices[0].message.content

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(ask, convs))
    assert answers == [greedy(engine, c) for c in convs]
    assert len(set(answers)) > 1


def test_raw_stream_is_well_formed_sse(base_url):
    body = {"model": NAME, "messages": HELLO, "max_tokens": 5, "stream": True}
    with httpx.stream("POST", f"{base_url}/chat/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [x for x in r.iter_lines() if x]
    assert lines[-1] == "data: [DONE]"
    for line in lines[:-1]:
        assert json.loads(line.removeprefix("data: "))["object"] == "chat.completion.chunk"


def test_stop_string_cuts_the_answer(client, engine):
    full = greedy(engine, HELLO, 16)
    stop = full[4:6]
    expected = full[: full.find(stop)]
    r = client.chat.completions.create(model=NAME, messages=HELLO, max_tokens=16,
                                       temperature=0, stop=[stop])
    assert r.choices[0].message.content == expected
    assert r.choices[0].finish_reason == "stop"
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model=NAME, messages=HELLO, max_tokens=16, temperature=0, stop=stop, stream=True))
    assert streamed == expected


def test_n_choices_with_a_seed_are_reproducible(client):
    def ask():
        r = client.chat.completions.create(model=NAME, messages=HELLO, max_tokens=8, n=3,
                                           temperature=1.0, seed=1234)
        return [c.message.content for c in r.choices], [c.index for c in r.choices]

    first, indexes = ask()
    assert indexes == [0, 1, 2]
    assert ask()[0] == first
    assert len(set(first)) > 1  # sampled choices differ from each other


def test_text_completions(client, engine):
    prompts = ["The quick brown fox", "Question: what is 2 + 2?"]
    r = client.completions.create(model=NAME, prompt=prompts, max_tokens=6, temperature=0)
    assert r.object == "text_completion" and [c.index for c in r.choices] == [0, 1]
    for prompt, choice in zip(prompts, r.choices, strict=True):
        alone = engine.generate_batch([engine.encode_text(prompt)],
                                      GenerationParams(6, temperature=0))[0]
        assert choice.text == alone.text
    assert r.usage.prompt_tokens == sum(len(engine.encode_text(p)) for p in prompts)
    pieces = client.completions.create(model=NAME, prompt=prompts[0], max_tokens=6,
                                       temperature=0, stream=True)
    assert "".join(c.choices[0].text for c in pieces) == r.choices[0].text


@pytest.mark.parametrize(("kwargs", "param"), [
    ({"temperature": 5}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"n": 0}, "n"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"extra_body": {"bogus_knob": 1}}, "bogus_knob"),
    ({"frequency_penalty": 0.5}, "frequency_penalty"),
])
def test_bad_parameters_are_400_naming_the_parameter(client, kwargs, param):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=NAME, messages=HELLO, **kwargs)
    assert info.value.status_code == 400
    assert info.value.body["param"] == param
    assert info.value.body["type"] == "invalid_request_error"


def test_request_errors_and_the_server_stays_up(client, base_url, engine):
    r = httpx.post(f"{base_url}/chat/completions", content=b"{not json", timeout=30,
                   headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="gpt-4o", messages=HELLO)
    assert info.value.body["code"] == "model_not_found" and NAME in info.value.message
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=NAME, messages=[
            {"role": "user", "content": "word " * 600}])
    assert info.value.body["code"] == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=NAME, messages=HELLO, max_tokens=100_000)
    assert info.value.body["code"] == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": " "}])
    assert info.value.body["code"] == "empty_prompt"
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=NAME, prompt="")
    assert info.value.body["code"] == "empty_prompt"
    r = httpx.get(f"{base_url}/nowhere", timeout=30)
    assert r.status_code == 404 and "error" in r.json()
    ok = client.chat.completions.create(model=NAME, messages=HELLO, max_tokens=10,
                                        temperature=0)
    assert ok.choices[0].message.content == greedy(engine, HELLO)


@pytest.fixture(scope="module")
def auth_url(engine):
    settings = ServerSettings(NAME, api_key=KEY, cors_origins=["http://app.example"])
    with running_server(create_app(engine, settings)) as url:
        yield url


def test_every_route_requires_the_key(auth_url):
    c = openai.OpenAI(base_url=auth_url, api_key="wrong", max_retries=0, timeout=30)
    for headers in ({"Authorization": openai.omit}, {}):  # no key sent, a wrong key
        with pytest.raises(openai.AuthenticationError):
            c.models.list(extra_headers=headers)
        with pytest.raises(openai.AuthenticationError):
            c.chat.completions.create(model=NAME, messages=HELLO, max_tokens=2,
                                      extra_headers=headers)
    for path in ("/models", "/nowhere"):
        r = httpx.get(auth_url + path, timeout=30)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    good = openai.OpenAI(base_url=auth_url, api_key=KEY, max_retries=0, timeout=30)
    assert [m.id for m in good.models.list().data] == [NAME]
    assert good.chat.completions.create(model=NAME, messages=HELLO, max_tokens=2).choices


def test_cors_only_when_configured(base_url, auth_url):
    preflight = {"Origin": "http://app.example", "Access-Control-Request-Method": "POST"}
    off = httpx.options(f"{base_url}/chat/completions", headers=preflight, timeout=30)
    assert "access-control-allow-origin" not in off.headers
    on = httpx.options(f"{auth_url}/chat/completions", headers=preflight, timeout=30)
    assert on.headers["access-control-allow-origin"] == "http://app.example"
    other = httpx.options(f"{auth_url}/chat/completions", timeout=30, headers={
        "Origin": "http://evil.example", "Access-Control-Request-Method": "POST"})
    assert "access-control-allow-origin" not in other.headers


class RecordingEngine:
    """The real engine, recording every batched stream's chunks by row."""

    def __init__(self, engine: HFEngine):
        self.engine, self.calls = engine, []

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def stream_batch(self, prompts, params, cancelled):
        rows = {i: [] for i in range(len(prompts))}
        self.calls.append(rows)
        for i, chunk in self.engine.stream_batch(prompts, params, cancelled):
            rows[i].append(chunk)
            yield i, chunk


@pytest.fixture
def generate_worker(monkeypatch):
    """Serve through the one-generate-at-a-time worker, as for a model the batcher refuses."""
    import tunesmith.infer.batcher as batcher

    def refuse(config, dtype, length=0):
        raise UnsupportedModelError("sliding-window layers (test)")

    monkeypatch.setattr(batcher, "cache_shape", refuse)


def test_a_client_leaving_mid_stream_cancels_its_generation(engine, generate_worker, caplog):
    recording = RecordingEngine(engine)
    body = {"model": NAME, "messages": HELLO, "max_tokens": 400, "stream": True,
            "temperature": 0}  # greedy: this prompt runs the full 400 tokens on the tiny model
    with running_server(create_app(recording, ServerSettings(NAME))) as url:
        with httpx.stream("POST", f"{url}/chat/completions", json=body, timeout=60) as r:
            next(r.iter_lines())  # generation has started; now hang up
        ok = openai.OpenAI(base_url=url, api_key="x", max_retries=0).chat.completions.create(
            model=NAME, messages=HELLO, max_tokens=10, temperature=0)
    assert ok.choices[0].message.content == greedy(engine, HELLO)
    dropped = recording.calls[0][0]
    assert all(c.finish_reason is None for c in dropped)  # never finished: it was dropped
    assert len(dropped) < 400
    assert "continuous batching is off for this model (sliding-window" in caplog.text


class GatedEngine:
    """The real engine, except that streams wait for `gate` before their first token."""

    def __init__(self, engine: HFEngine):
        self.engine, self.gate, self.started = engine, threading.Event(), threading.Event()

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def stream_batch(self, prompts, params, cancelled):
        self.started.set()
        self.gate.wait(timeout=60)
        yield from self.engine.stream_batch(prompts, params, cancelled)


def test_a_full_queue_answers_503_and_the_queue_drains(engine, generate_worker):
    gated = GatedEngine(engine)
    body = {"model": NAME, "messages": HELLO, "max_tokens": 4, "stream": True,
            "stream_options": {"include_usage": True}}
    settings = ServerSettings(NAME, max_queue=1, max_batch=1)
    with running_server(create_app(gated, settings)) as url, \
            httpx.Client(timeout=60) as http:
        with http.stream("POST", f"{url}/chat/completions", json=body) as running:
            assert gated.started.wait(30)  # the worker holds this one
            with http.stream("POST", f"{url}/chat/completions", json=body) as waiting:
                assert waiting.status_code == 200  # queued behind it
                third = http.post(f"{url}/chat/completions", json=body)
                assert third.status_code == 503
                assert third.json()["error"]["code"] == "server_busy"
                gated.gate.set()
                for r in (running, waiting):
                    lines = [x for x in r.iter_lines() if x]
                    assert lines[-1] == "data: [DONE]"
                    usage = json.loads(lines[-2].removeprefix("data: "))["usage"]
                    assert 1 <= usage["completion_tokens"] <= 4


def test_request_bodies_are_not_logged(client, caplog):
    secret = "TOP-SECRET-PAYLOAD-42"
    caplog.set_level("DEBUG")
    client.chat.completions.create(model=NAME, max_tokens=2,
                                   messages=[{"role": "user", "content": secret}])
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=NAME, temperature=9,
                                       messages=[{"role": "user", "content": secret}])
    assert caplog.records  # the client and server did log something
    assert not any(secret in r.getMessage() for r in caplog.records)


def _wait_for(condition, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_batcher_drops_a_stream_whose_client_left(engine):
    body = {"model": NAME, "messages": HELLO, "max_tokens": 400, "stream": True,
            "temperature": 0}  # greedy: this prompt runs the full 400 tokens on the tiny model
    app = create_app(engine, ServerSettings(NAME))
    stats = app.state.worker.batcher.stats
    with running_server(app) as url:
        with httpx.stream("POST", f"{url}/chat/completions", json=body, timeout=60) as r:
            next(r.iter_lines())  # generation has started; now hang up
        ok = openai.OpenAI(base_url=url, api_key="x", max_retries=0).chat.completions.create(
            model=NAME, messages=HELLO, max_tokens=10, temperature=0)
        assert ok.choices[0].message.content == greedy(engine, HELLO)
        _wait_for(lambda: stats.cancelled == 1)
        assert stats.decode_steps < 399 and stats.finished == 1


def test_batcher_queue_full_answers_503_and_drains(engine):
    body = {"model": NAME, "messages": HELLO, "max_tokens": 4, "stream": True,
            "stream_options": {"include_usage": True}}
    app = create_app(engine, ServerSettings(NAME, max_queue=1, max_batch=1))
    batcher = app.state.worker.batcher
    with running_server(app) as url, httpx.Client(timeout=60) as http:
        with engine._lock:  # the engine thread takes the first request, then waits here
            running = http.send(http.build_request("POST", f"{url}/chat/completions",
                                                   json=body), stream=True)
            _wait_for(lambda: batcher.waiting() == 0)
            waiting = http.send(http.build_request("POST", f"{url}/chat/completions",
                                                   json=body), stream=True)
            _wait_for(lambda: batcher.waiting() == 1)  # no free slot: it waits
            third = http.post(f"{url}/chat/completions", json=body)
            assert third.status_code == 503
            assert third.json()["error"]["code"] == "server_busy"
        for r in (running, waiting):
            assert r.status_code == 200
            lines = [x for x in r.iter_lines() if x]
            r.close()
            assert lines[-1] == "data: [DONE]"
            usage = json.loads(lines[-2].removeprefix("data: "))["usage"]
            assert 1 <= usage["completion_tokens"] <= 4
