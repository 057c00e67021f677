"""Request bodies of the OpenAI-compatible API, validated by pydantic.

Unknown fields are refused (OpenAI does the same), so a parameter the server cannot honour
is never dropped silently; a few common ones are accepted only at their neutral values.
"""

from __future__ import annotations

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


class ChatMessage(_Strict):
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[TextPart | ImagePart] | None = None
    name: str | None = None

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


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: Literal[False] | None = None

    def conversation(self) -> list[dict[str, Any]]:
        """Messages as the chat template expects them (developer -> system)."""
        out: list[dict[str, Any]] = []
        for m in self.messages:
            msg = {"role": "system" if m.role == "developer" else m.role, "content": m.text()}
            if m.image_urls():
                msg["images"] = m.image_urls()
            out.append(msg)
        return out

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
