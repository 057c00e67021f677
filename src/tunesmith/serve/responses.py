"""Response bodies and server-sent-event chunks in OpenAI's formats."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any, Literal

from tunesmith.infer.engine import Completion
from tunesmith.serve.tools import openai_tool_calls, parse_tool_calls

Kind = Literal["chat", "text"]


@dataclass
class ResponseMeta:
    """What every body and chunk of one response shares."""

    kind: Kind
    model: str
    id: str = ""
    created: int = 0
    tools: bool = False  # the request offered tools: answers are read for tool calls

    def __post_init__(self) -> None:
        prefix = "chatcmpl" if self.kind == "chat" else "cmpl"
        self.id = self.id or f"{prefix}-{uuid.uuid4().hex}"
        self.created = self.created or int(time.time())

    def head(self, chunk: bool) -> dict[str, Any]:
        if self.kind == "chat":
            obj = "chat.completion.chunk" if chunk else "chat.completion"
        else:
            obj = "text_completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def full_body(meta: ResponseMeta, results: list[Completion], prompt_tokens: int
              ) -> dict[str, Any]:
    """A non-streaming response; prompt_tokens counts every distinct prompt once."""
    choices = []
    for i, r in enumerate(results):
        if meta.kind == "chat":
            message, finish = assistant_message(meta, r)
            choices.append({"index": i, "message": message, "finish_reason": finish,
                            "logprobs": None})
        else:
            choices.append({"index": i, "text": r.text, "finish_reason": r.finish_reason,
                            "logprobs": None})
    completion = sum(r.completion_tokens for r in results)
    return {**meta.head(False), "choices": choices, "usage": usage(prompt_tokens, completion)}


def assistant_message(meta: ResponseMeta, r: Completion) -> tuple[dict[str, Any], str]:
    """(message, finish_reason) of one chat choice; tool calls are read back from the text
    when the request offered tools (finish_reason "tool_calls")."""
    if meta.tools:
        content, calls = parse_tool_calls(r.text)
        if calls:
            return ({"role": "assistant", "content": content or None,
                     "tool_calls": openai_tool_calls(calls)}, "tool_calls")
    return {"role": "assistant", "content": r.text}, r.finish_reason


def chunk_event(meta: ResponseMeta, index: int, *, text: str | None = None,
                role: bool = False, finish_reason: str | None = None,
                with_usage: bool = False, tool_calls: list | None = None) -> str:
    """One `data: {...}` event carrying a piece of choice `index`."""
    if meta.kind == "chat":
        delta: dict[str, Any] = {}
        if role:
            delta["role"] = "assistant"
        if text is not None:
            delta["content"] = text
        if tool_calls:
            delta["tool_calls"] = [{"index": k, **call} for k, call in enumerate(tool_calls)]
        choice = {"index": index, "delta": delta, "finish_reason": finish_reason,
                  "logprobs": None}
    else:
        choice = {"index": index, "text": text or "", "finish_reason": finish_reason,
                  "logprobs": None}
    body = {**meta.head(True), "choices": [choice]}
    if with_usage:
        body["usage"] = None  # OpenAI: null on every chunk but the final usage chunk
    return sse(body)


def usage_event(meta: ResponseMeta, prompt_tokens: int, completion_tokens: int) -> str:
    return sse({**meta.head(True), "choices": [],
                "usage": usage(prompt_tokens, completion_tokens)})


def sse(body: dict[str, Any]) -> str:
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"


DONE = "data: [DONE]\n\n"
