"""Request bodies of the OpenAI-compatible API, validated by pydantic.

Unknown fields are refused (OpenAI does the same), so a parameter the server cannot honour
is never dropped silently; a few common ones are accepted only at their neutral values.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

MAX_N = 16
MAX_STOPS = 4


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ImageURL(_Strict):
    url: str
    detail: Literal["auto", "low", "high"] | None = None


class ImagePart(_Strict):
    """An image (vision-language models): a data: URL, an allowed local path, or a remote
    URL when the server allows fetching."""

    type: Literal["image_url"]
    image_url: ImageURL


class CalledFunction(_Strict):
    name: str
    arguments: str  # a JSON object, as text (OpenAI's shape)

    @field_validator("arguments")
    @classmethod
    def _check_arguments(cls, v: str) -> str:
        try:
            json.loads(v)
        except json.JSONDecodeError as exc:
            raise ValueError(f"not JSON ({exc.msg}); send the arguments as a JSON object "
                             "in a string") from None
        return v


class ToolCall(_Strict):
    id: str
    type: Literal["function"] = "function"
    function: CalledFunction


class FunctionSpec(_Strict):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolSpec(_Strict):
    type: Literal["function"]
    function: FunctionSpec


class ChatMessage(_Strict):
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[TextPart | ImagePart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None

    def text(self) -> str:
        """The text, with an <image> placeholder where each image part stands."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text if isinstance(p, TextPart) else "<image>" for p in self.content)

    def image_urls(self) -> list[str]:
        if not isinstance(self.content, list):
            return []
        return [p.image_url.url for p in self.content if isinstance(p, ImagePart)]

    def template_dict(self) -> dict[str, Any]:
        """The message as chat templates expect it (tool-call arguments as objects)."""
        d: dict[str, Any] = {"role": "system" if self.role == "developer" else self.role,
                             "content": self.text()}
        if self.image_urls():  # text with an <image> per image part, in the request's order
            d["images"] = self.image_urls()
        if self.tool_calls:
            d["tool_calls"] = [{"id": c.id, "type": "function", "function": {
                "name": c.function.name, "arguments": json.loads(c.function.arguments)}}
                for c in self.tool_calls]
        if self.tool_call_id is not None:
            d["tool_call_id"] = self.tool_call_id
        if self.name is not None and self.role == "tool":
            d["name"] = self.name
        return d


class StreamOptions(_Strict):
    include_usage: bool = False


class _Sampling(_Strict):
    """Parameters shared by chat and text completions."""

    model: str
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    n: int = Field(1, ge=1, le=MAX_N)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    user: str | None = None
    # neutral values only: the engine has no such penalties / biases
    presence_penalty: float = Field(0.0, ge=0, le=0)
    frequency_penalty: float = Field(0.0, ge=0, le=0)
    logit_bias: dict[str, float] | None = None
    # extensions many OpenAI-compatible servers accept
    top_k: int | None = Field(None, ge=0)
    repetition_penalty: float | None = Field(None, gt=0)

    @field_validator("stop")
    @classmethod
    def _check_stop(cls, v: str | list[str] | None) -> list[str]:
        stops = [v] if isinstance(v, str) else list(v or [])
        if len(stops) > MAX_STOPS:
            raise ValueError(f"at most {MAX_STOPS} stop sequences, got {len(stops)}")
        if any(s == "" for s in stops):
            raise ValueError("stop sequences must not be empty strings")
        return stops

    @field_validator("logit_bias")
    @classmethod
    def _check_bias(cls, v: dict[str, float] | None) -> None:
        if v:
            raise ValueError("logit_bias is not supported by this server")
        return None

    def stop_list(self) -> list[str]:
        return list(self.stop or [])  # already normalised to a list by the validator


class NamedFunction(_Strict):
    name: str


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: NamedFunction


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: Literal[False] | None = None
    tools: list[ToolSpec] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None

    def conversation(self) -> list[dict[str, Any]]:
        """Messages as the chat template expects them (developer -> system)."""
        return [m.template_dict() for m in self.messages]

    def template_tools(self) -> list[dict[str, Any]] | None:
        """Tools to render into the prompt (none when tool_choice is "none")."""
        if not self.tools or self.tool_choice == "none":
            return None
        return [t.model_dump(exclude_none=True) for t in self.tools]

    def requested_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class CompletionRequest(_Sampling):
    prompt: str | list[str]
    echo: Literal[False] = False
    logprobs: None = None
    suffix: None = None
    best_of: Literal[1] | None = None

    def prompts(self) -> list[str]:
        return [self.prompt] if isinstance(self.prompt, str) else list(self.prompt)

    def requested_tokens(self) -> int | None:
        return self.max_tokens
