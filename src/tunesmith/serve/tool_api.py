"""Request checks for tools and image parts in chat requests."""

from __future__ import annotations

from typing import Any

from tunesmith.serve.errors import APIError
from tunesmith.serve.protocol import ChatCompletionRequest


def check_tool_choice(req: ChatCompletionRequest) -> None:
    """tool_choice "none" | "auto" are honoured; forcing a call is refused, not ignored."""
    if req.parallel_tool_calls is False:
        raise APIError(400, "parallel_tool_calls: false cannot be guaranteed by this server "
                       "(the model may answer several calls); drop it", param=
                       "parallel_tool_calls", code="unsupported_value")
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
