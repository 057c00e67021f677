"""The OpenAI-compatible FastAPI app: /v1/models, /v1/chat/completions, /v1/completions.

```
request --BearerAuth (when a key is set)--> route --parse + validate (400s)--> token ids
  --context check--> GenerationWorker queue (one generate at a time) --> JSON or SSE
```
Request bodies are never logged; failures are logged by type and path only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from tunesmith.errors import (
    ConfigError,
    DataError,
    ModelError,
    TunesmithError,
    UnsupportedModelError,
)

try:  # the one place the server's optional dependencies are imported
    import uvicorn  # noqa: F401
    from fastapi import FastAPI
    from fastapi import Request as HTTPRequest
    from fastapi.responses import JSONResponse, StreamingResponse
    from pydantic import BaseModel, ValidationError
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise TunesmithError(f"tunesmith api needs the serve extra ({exc.name} is missing): "
                         "pip install 'tunesmith[serve]'") from None

from tunesmith.infer.engine import Chunk, Completion, GenerationParams, HFEngine
from tunesmith.infer.vision import encode_vision_prompt, has_images
from tunesmith.serve.errors import APIError, error_body
from tunesmith.serve.limits import DEFAULT_MAX_REQUEST_BYTES, BodyLimit
from tunesmith.serve.media import MediaPolicy, load_request_images
from tunesmith.serve.protocol import ChatCompletionRequest, CompletionRequest
from tunesmith.serve.responses import (
    DONE,
    ResponseMeta,
    chunk_event,
    full_body,
    sse,
    usage_event,
)
from tunesmith.serve.tool_api import check_images, check_tool_choice
from tunesmith.serve.tools import ToolStreamSplitter, openai_tool_calls
from tunesmith.serve.worker import GenerationWorker, QueueFull

log = logging.getLogger(__name__)
T = TypeVar("T", bound=BaseModel)
Request = ChatCompletionRequest | CompletionRequest


@dataclass
class ServerSettings:
    model_name: str
    api_key: str = ""
    cors_origins: list[str] = field(default_factory=list)
    max_queue: int = 256
    max_batch: int = 16  # streams generated together at most
    max_model_len: int = 0  # 0: the model's max_position_embeddings
    default_max_tokens: int = 512
    cuda_graphs: bool = True  # decode steps replayed from CUDA graphs (GPU)
    kv_cache_fraction: float = 0.85  # share of free GPU memory for the KV cache
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES  # larger bodies: 413, never parsed
    media: MediaPolicy = field(default_factory=MediaPolicy)  # where request images may come from


def parse_body(raw: bytes, model: type[T]) -> T:
    """JSON bytes -> validated request, or an APIError naming the bad field."""
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise APIError(400, f"the request body is not valid JSON ({exc.msg} at line "
                       f"{exc.lineno} column {exc.colno}); send a JSON object",
                       code="invalid_json") from None
    except UnicodeDecodeError:
        raise APIError(400, "the request body is not UTF-8 text; send a JSON object",
                       code="invalid_json") from None
    if not isinstance(data, dict):
        raise APIError(400, f"the request body must be a JSON object, got "
                       f"{type(data).__name__}", code="invalid_json")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(x) for x in err["loc"]) or "body"
        if err["type"] == "extra_forbidden":
            raise APIError(400, f"unrecognized request argument: {loc}", param=loc,
                           code="unknown_parameter") from None
        shown = repr(err.get("input"))
        shown = shown if len(shown) <= 80 else shown[:77] + "..."
        raise APIError(400, f"{loc}: {err['msg']} (got {shown})", param=loc,
                       code="invalid_value") from None


class Service:
    """Turns validated requests into queued generation jobs and OpenAI responses."""

    def __init__(self, engine: HFEngine, settings: ServerSettings, worker: GenerationWorker):
        self.engine, self.settings, self.worker = engine, settings, worker

    def models(self) -> dict[str, Any]:
        return {"object": "list", "data": [{"id": self.settings.model_name, "object": "model",
                                            "created": 0, "owned_by": "tunesmith"}]}

    async def chat(self, raw: bytes) -> Any:
        req = parse_body(raw, ChatCompletionRequest)
        self._check_common(req)
        check_tool_choice(req)
        check_images(req, self.engine, self.settings.model_name)
        conv = req.conversation()
        if not any(_has_content(m) for m in conv):
            raise APIError(400, "messages: every message is empty; send a user message with "
                           "some text", param="messages", code="empty_prompt")
        tools = req.template_tools()
        extra: dict[str, Any] | None = None  # pixel inputs of a vision-language prompt
        try:
            if has_images(conv):
                conv = load_request_images(conv, self.settings.media)
                ids, extra = encode_vision_prompt(conv, self.engine.renderer,
                                                  self.engine.tokenizer, self.engine.vision,
                                                  self.engine.model)
            else:
                ids = self.engine.encode_chat(conv, tools)
        except (DataError, ConfigError) as exc:
            raise APIError(400, f"messages: {exc}", param="messages",
                           code="invalid_messages") from None
        meta = ResponseMeta("chat", self.settings.model_name, tools=tools is not None)
        return await self._respond(meta, req, [ids], extra)

    async def completions(self, raw: bytes) -> Any:
        req = parse_body(raw, CompletionRequest)
        self._check_common(req)
        texts = req.prompts()
        if not texts or any(not t.strip() for t in texts):
            raise APIError(400, "prompt: empty prompt; send some text to complete",
                           param="prompt", code="empty_prompt")
        prompts = [self.engine.encode_text(t) for t in texts]
        return await self._respond(ResponseMeta("text", self.settings.model_name), req, prompts)

    def _check_common(self, req: Request) -> None:
        if req.model != self.settings.model_name:
            raise APIError(404, f"model {req.model!r} is not served here; this server serves "
                           f"{self.settings.model_name!r} (see GET /v1/models)", param="model",
                           code="model_not_found")
        if req.stream_options is not None and not req.stream:
            raise APIError(400, "stream_options: only allowed when stream is true",
                           param="stream_options", code="invalid_value")

    def params(self, req: Request, prompts: list[list[int]]) -> GenerationParams:
        """Sampling parameters, with the prompt and completion checked against the context."""
        limit = self.settings.max_model_len or self.engine.max_length
        longest = max(len(p) for p in prompts)
        requested = req.requested_tokens()
        where = "messages" if isinstance(req, ChatCompletionRequest) else "prompt"
        if limit and longest >= limit:
            raise APIError(400, f"{where}: the prompt has {longest} tokens but this model's "
                           f"context is {limit} tokens; shorten the prompt", param=where,
                           code="context_length_exceeded")
        if limit and requested and longest + requested > limit:
            raise APIError(400, f"max_tokens: {longest} prompt tokens + {requested} completion "
                           f"tokens exceed this model's context of {limit} tokens; lower "
                           "max_tokens or shorten the prompt", param="max_tokens",
                           code="context_length_exceeded")
        default = self.settings.default_max_tokens
        params = GenerationParams(
            max_new_tokens=requested or (min(default, limit - longest) if limit else default),
            temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p, top_k=req.top_k or 0,
            repetition_penalty=req.repetition_penalty or 1.0, stop=req.stop_list(),
            seed=req.seed)
        problems = params.check()
        if problems:
            raise APIError(400, "; ".join(problems), code="invalid_value")
        return params

    async def _respond(self, meta: ResponseMeta, req: Request, prompts: list[list[int]],
                       extra: dict[str, Any] | None = None) -> Any:
        """`extra`: a vision prompt's pixel inputs; such a request generates on its own."""
        params = self.params(req, prompts)
        prompt_tokens = sum(len(p) for p in prompts)
        jobs = choice_jobs(prompts, req.n, params)
        items = self._open(jobs) if extra is None else self._open_with_pixels(jobs, extra)
        if req.stream:
            usage = bool(req.stream_options and req.stream_options.include_usage)
            events = self._events(meta, items, prompt_tokens, usage)
            return StreamingResponse(events, media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        results = await _collect(items, len(prompts) * req.n, prompt_tokens)
        return JSONResponse(full_body(meta, results, prompt_tokens))

    def _open(self, jobs: list[tuple[list[int], GenerationParams]]
              ) -> AsyncIterator[tuple[int, Chunk]]:
        try:
            if len(jobs) == 1:  # may share a batch with other streams
                return _first_row(self.worker.open_stream(*jobs[0]))
            return self.worker.open_many(jobs)
        except QueueFull:
            raise _busy() from None
        except ModelError as exc:  # the batcher's own context check (its cache slots)
            raise APIError(400, str(exc), param="max_tokens",
                           code="context_length_exceeded") from None

    def _open_with_pixels(self, jobs: list[tuple[list[int], GenerationParams]],
                          extra: dict[str, Any]) -> AsyncIterator[tuple[int, Chunk]]:
        """A vision-language prompt: its choices stream in turn in the worker thread, each
        generating with the prompt's pixel inputs (vision models are served by the
        one-generate-at-a-time worker, see build_streams)."""
        def make() -> Iterator[tuple[int, Chunk]]:
            for index, (ids, params) in enumerate(jobs):
                with contextlib.closing(self.engine.stream_ids(ids, params, extra)) as chunks:
                    for chunk in chunks:
                        yield index, chunk

        try:
            return self.worker.open(make)
        except QueueFull:
            raise _busy() from None

    async def _events(self, meta: ResponseMeta, items: AsyncIterator[tuple[int, Chunk]],
                      prompt_tokens: int, usage: bool) -> AsyncIterator[str]:
        started: dict[int, ToolStreamSplitter] = {}  # with tools, calls are held back
        completion = 0
        try:
            async for index, chunk in items:
                if index not in started and meta.kind == "chat":
                    yield chunk_event(meta, index, role=True, text="", with_usage=usage)
                split = started.setdefault(index, ToolStreamSplitter())
                text, calls = split.add(chunk.text) if meta.tools else chunk.text, []
                if meta.tools and chunk.finish_reason is not None:
                    tail, calls = split.finish()
                    text += tail
                if text:
                    yield chunk_event(meta, index, text=text, with_usage=usage)
                if calls:
                    yield chunk_event(meta, index, tool_calls=openai_tool_calls(calls),
                                      with_usage=usage)
                if chunk.finish_reason is not None:
                    completion += chunk.completion_tokens
                    yield chunk_event(meta, index, with_usage=usage, finish_reason=(
                        "tool_calls" if calls else chunk.finish_reason))
        except Exception as exc:  # the response has started: report in the stream
            log.error("generation failed: %s", type(exc).__name__)
            yield sse(error_body(500, f"generation failed ({type(exc).__name__})"))
        finally:
            await items.aclose()  # type: ignore[attr-defined]
        if usage:
            yield usage_event(meta, prompt_tokens, completion)
        yield DONE


def _has_content(message: dict[str, Any]) -> bool:
    content = message["content"]
    if isinstance(content, list):  # parts with images (vision-language engines only)
        return bool(content)
    return bool(content.strip() or message.get("tool_calls"))


def _busy() -> APIError:
    return APIError(503, "the server is busy (request queue full); retry shortly",
                    code="server_busy")


def choice_jobs(prompts: list[list[int]], n: int, params: GenerationParams
                ) -> list[tuple[list[int], GenerationParams]]:
    """One job per choice; a seed becomes seed + choice index, so a seeded request is
    reproducible as a whole and its choices still differ."""
    jobs = []
    for ids in prompts:
        for _ in range(n):
            seed = None if params.seed is None else params.seed + len(jobs)
            jobs.append((ids, dataclasses.replace(params, seed=seed)))
    return jobs


async def _collect(items: AsyncIterator[tuple[int, Chunk]], count: int, prompt_tokens: int
                   ) -> list[Completion]:
    """The whole text of each choice, as Completions in choice order."""
    pieces: list[list[str]] = [[] for _ in range(count)]
    last = [Chunk("") for _ in range(count)]
    async for index, chunk in items:
        pieces[index].append(chunk.text)
        last[index] = chunk
    return [Completion("".join(p), c.finish_reason or "stop", prompt_tokens,
                       c.completion_tokens) for p, c in zip(pieces, last, strict=True)]


async def _first_row(chunks: AsyncIterator[Chunk]) -> AsyncIterator[tuple[int, Chunk]]:
    try:
        async for chunk in chunks:
            yield 0, chunk
    finally:
        await chunks.aclose()  # type: ignore[attr-defined]


def build_streams(engine: HFEngine, settings: ServerSettings) -> Any:
    """The continuous batcher for models its slot cache serves; the one-generate-at-a-time
    worker otherwise (said in the log)."""
    from tunesmith.infer.batcher import BatcherOptions, ContinuousBatcher
    from tunesmith.serve.streams import BatcherStreams

    options = BatcherOptions(max_batch=settings.max_batch, max_len=settings.max_model_len,
                             max_waiting=settings.max_queue,
                             memory_fraction=settings.kv_cache_fraction,
                             cuda_graphs=settings.cuda_graphs)
    try:
        if engine.vision is not None:
            raise UnsupportedModelError("pixel inputs of vision-language prompts are not "
                                        "batched yet")
        return BatcherStreams(ContinuousBatcher(engine, options))
    except UnsupportedModelError as exc:
        log.warning("continuous batching is off for this model (%s); requests are served "
                    "by one generate call at a time", exc)
        return GenerationWorker(engine, settings.max_queue, settings.max_batch)


def create_app(engine: HFEngine, settings: ServerSettings) -> Any:
    """The FastAPI app serving `engine` under `settings.model_name`."""
    worker = build_streams(engine, settings)
    service = Service(engine, settings, worker)

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        yield
        worker.close()

    app = FastAPI(title="tunesmith", docs_url=None, redoc_url=None, openapi_url=None,
                  lifespan=lifespan)

    @app.get("/v1/models")
    async def list_models() -> Any:
        return service.models()

    @app.get("/v1/models/{model_id:path}")
    async def get_model(model_id: str) -> Any:
        if model_id != settings.model_name:
            raise APIError(404, f"model {model_id!r} is not served here; this server serves "
                           f"{settings.model_name!r}", param="model", code="model_not_found")
        return service.models()["data"][0]

    @app.post("/v1/chat/completions", openapi_extra=_body_schema(ChatCompletionRequest))
    async def chat_completions(request: HTTPRequest) -> Any:
        return await service.chat(await request.body())

    @app.post("/v1/completions", openapi_extra=_body_schema(CompletionRequest))
    async def completions(request: HTTPRequest) -> Any:
        return await service.completions(await request.body())

    _add_error_handlers(app)
    _add_middleware(app, settings)
    app.state.service = service
    app.state.worker = worker
    return app


def _body_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The request body in the app's OpenAPI document (the routes read raw bodies, so
    FastAPI cannot infer it); `$defs` stay inside the schema, which is self-contained."""
    return {"requestBody": {"required": True, "content": {
        "application/json": {"schema": model.model_json_schema()}}}}


def _add_error_handlers(app: Any) -> None:
    from starlette.exceptions import HTTPException

    async def on_api_error(request: Any, exc: APIError) -> Any:
        return JSONResponse(exc.body(), status_code=exc.status)

    async def on_http_error(request: Any, exc: HTTPException) -> Any:
        return JSONResponse(error_body(exc.status_code, str(exc.detail)),
                            status_code=exc.status_code)

    async def on_error(request: Any, exc: Exception) -> Any:
        log.error("%s %s failed: %s", request.method, request.url.path, type(exc).__name__,
                  exc_info=exc)
        return JSONResponse(error_body(500, f"internal error ({type(exc).__name__}); see the "
                                       "server log"), status_code=500)

    app.add_exception_handler(APIError, on_api_error)
    app.add_exception_handler(HTTPException, on_http_error)
    app.add_exception_handler(Exception, on_error)


def _add_middleware(app: Any, settings: ServerSettings) -> None:
    from tunesmith.serve.security import BearerAuth

    if settings.api_key:
        app.add_middleware(BearerAuth, api_key=settings.api_key)
    app.add_middleware(BodyLimit, max_bytes=settings.max_request_bytes)  # before auth/routes
    if settings.cors_origins:  # added last, so it is outermost and answers preflights
        from fastapi.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=settings.cors_origins,
                           allow_methods=["GET", "POST", "OPTIONS"],
                           allow_headers=["Authorization", "Content-Type"])
