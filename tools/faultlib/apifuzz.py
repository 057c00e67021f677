"""API fuzz: requests generated from the server's own OpenAPI document (hypothesis, through
faultlib/schemagen.py), plus junk bodies, unknown paths and methods, sent over HTTP to a
real uvicorn server with a tiny model. Figure: responses >= 500 (goal 0), and whether the
server still answers afterwards. Also: a body over the limit is answered 413 without the
tokenizer ever being called."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

NAME = "tiny-fuzz"


def _strategies(app: Any) -> Any:
    from hypothesis import strategies as st

    from faultlib.schemagen import from_schema

    doc = app.openapi()
    routes = []
    for path, ops in doc["paths"].items():
        body = ops.get("post", {}).get("requestBody")
        if body:
            schema = body["content"]["application/json"]["schema"]
            routes.append(st.tuples(st.just(path), from_schema(schema).map(_aim)))
    junk = st.tuples(st.sampled_from(["/v1/chat/completions", "/v1/completions"]),
                     st.binary(max_size=200) | st.text(max_size=100).map(str.encode)
                     | st.recursive(st.none() | st.booleans() | st.integers() | st.text(),
                                    lambda c: st.lists(c) | st.dictionaries(st.text(), c),
                                    max_leaves=10))
    return st.one_of(*routes, junk)


def _aim(body: Any) -> Any:
    """Half of the generated bodies name the served model, so they pass the model check and
    reach tokenisation and generation; generation is kept short."""
    if isinstance(body, dict) and hash(json.dumps(body, sort_keys=True, default=str)) % 2:
        body["model"] = NAME
        if isinstance(body.get("max_tokens"), int):
            body["max_tokens"] = min(body["max_tokens"], 8)
        if isinstance(body.get("max_completion_tokens"), int):
            body["max_completion_tokens"] = min(body["max_completion_tokens"], 8)
        body.setdefault("max_tokens", 4)
    return body


def _send(client: Any, path: str, body: Any) -> int:
    data = body if isinstance(body, bytes) else json.dumps(body, default=str).encode()
    r = client.post(path.removeprefix("/v1"), content=data,
                    headers={"content-type": "application/json"})
    return r.status_code


def api_fuzz(examples: int = 300, model_dir: Path | None = None) -> dict[str, Any]:
    import httpx
    from hypothesis import HealthCheck, given, settings

    from server_thread import running_server
    from tunesmith.infer.engine import HFEngine
    from tunesmith.serve.app import ServerSettings, create_app

    if model_dir is None:
        import tempfile

        from tiny import save_tiny_model
        model_dir = save_tiny_model(Path(tempfile.mkdtemp()))
    engine = HFEngine(str(model_dir))
    app = create_app(engine, ServerSettings(NAME, max_request_bytes=64 * 1024))
    statuses: dict[int, int] = {}
    with running_server(app) as url, httpx.Client(base_url=url, timeout=60) as client:
        @settings(max_examples=examples, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(case=_strategies(app))
        def fuzz(case: tuple[str, Any]) -> None:
            status = _send(client, *case)
            statuses[status] = statuses.get(status, 0) + 1

        fuzz()
        for method, path in (("GET", "/nope"), ("DELETE", "/chat/completions"),
                             ("PUT", "/models"), ("GET", "/models/" + "x" * 5000)):
            code = client.request(method, path).status_code
            statuses[code] = statuses.get(code, 0) + 1
        alive = client.get("/models").status_code == 200
        limit = _limit_check(client, engine)
    sent = sum(statuses.values())
    errors = sum(n for s, n in statuses.items() if s >= 500)
    return {"fault": "API fuzz (OpenAPI schema)", "count": sent,
            "ok": sent - errors if alive and limit else 0, "statuses": statuses,
            "how": "bodies generated from the app's OpenAPI request schemas (half aimed at the "
                   "served model), junk bytes and JSON, unknown paths and methods, over HTTP; "
                   "then a body over the limit (413, tokenizer never called)",
            "notes": [f"server alive after: {alive}", f"413 before tokenising: {limit}"]}


def _limit_check(client: Any, engine: Any) -> bool:
    """A prompt over the body limit: 413, and the engine's tokenizer is never called."""
    calls = [0]
    real = engine.encode_chat

    def counting(*a: Any, **kw: Any) -> Any:
        calls[0] += 1
        return real(*a, **kw)

    engine.encode_chat = counting
    try:
        body = {"model": NAME, "messages": [{"role": "user", "content": "x" * 100_000}]}
        status = _send(client, "/v1/chat/completions", body)
    finally:
        engine.encode_chat = real
    return status == 413 and calls[0] == 0
