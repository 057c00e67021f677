"""Request checks and streamed answers for tools and image parts in chat requests.

With tools, a streamed answer is sent once the choice is complete (a tool call can only be
recognised in the whole text): role, then the content or the tool calls, then the finish
reason, exactly the chunks OpenAI's streaming clients assemble.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable
from typing import Any

from tunesmith.infer.engine import Completion
from tunesmith.serve.errors import APIError, error_body
from tunesmith.serve.protocol import ChatCompletionRequest
from tunesmith.serve.responses import (
    DONE,
    ResponseMeta,
    assistant_message,
    chunk_event,
    sse,
    usage_event,
)


def check_tool_choice(req: ChatCompletionRequest) -> None:
    """tool_choice "none" | "auto" are honoured; forcing a call is refused, not ignored."""
    choice = req.tool_choice
    if choice is None or choice in ("none", "auto"):
        if choice == "auto" and not req.tools:
            raise APIError(400, "tool_choice: 'auto' needs tools; send tools or drop "
                           "tool_choice", param="tool_choice", code="invalid_value")
        return
    shown = choice if isinstance(choice, str) else f"function {choice.function.name!r}"
    raise APIError(400, f"tool_choice: {shown} would force a tool call, which this server "
                   "cannot guarantee (no constrained decoding); use 'auto'",
                   param="tool_choice", code="unsupported_value")


def check_images(req: ChatCompletionRequest, engine: Any, model_name: str) -> None:
    """Image parts go to a vision-language engine only; a text model answers 400."""
    if getattr(engine, "accepts_images", False):
        return
    for i, message in enumerate(req.messages):
        if message.image_urls():
            raise APIError(400, f"messages.{i}.content: image parts need a vision-language "
                           f"model; {model_name!r} reads text only. Send text parts, or serve "
                           "a vision-language model", param=f"messages.{i}.content",
                           code="images_not_supported")


async def tool_events(meta: ResponseMeta, results: Awaitable[list[Completion]],
                      prompt_tokens: int, usage: bool) -> AsyncIterator[str]:
    """SSE events of complete choices: content or tool calls, then the finish reason."""
    try:
        done = await results
    except Exception as exc:  # the response has started: report in the stream
        yield sse(error_body(500, f"generation failed ({type(exc).__name__})"))
        yield DONE
        return
    completion = 0
    for index, r in enumerate(done):
        message, finish = assistant_message(meta, r)
        yield chunk_event(meta, index, role=True, text="", with_usage=usage)
        if message.get("tool_calls"):
            yield chunk_event(meta, index, tool_calls=message["tool_calls"], with_usage=usage)
        elif message["content"]:
            yield chunk_event(meta, index, text=message["content"], with_usage=usage)
        yield chunk_event(meta, index, finish_reason=finish, with_usage=usage)
        completion += r.completion_tokens
    if usage:
        yield usage_event(meta, prompt_tokens, completion)
    yield DONE
