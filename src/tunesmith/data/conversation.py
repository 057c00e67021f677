"""The one typed conversation structure every dataset format converts into."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Role = Literal["system", "user", "assistant", "tool"]
ROLES: tuple[str, ...] = ("system", "user", "assistant", "tool")


@dataclass
class Message:
    role: Role
    content: str
    tool_calls: list[dict[str, Any]] | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            d["tool_calls"] = self.tool_calls
        return d


@dataclass
class Conversation:
    """A sample: ordered messages, optional tool schemas, and where it came from."""

    messages: list[Message]
    tools: list[dict[str, Any]] | None = None
    source: str = ""  # "file:line" or "dataset[row]" for error messages
    rejected: Message | None = None  # preference pairs: messages[-1] is the chosen answer
    plain: bool = False  # stage pt: messages[0].content is raw text, no roles or template
    extra: dict[str, Any] = field(default_factory=dict)
    images: list[Any] = field(default_factory=list)  # paths (or frame data) per <image>
    videos: list[Any] = field(default_factory=list)  # a path or a list of frame paths per <video>

    def dicts(self) -> list[dict[str, Any]]:
        return [m.to_dict() for m in self.messages]


def check_conversation(conv: Conversation) -> str | None:
    """Why a conversation cannot be trained on, or None when it is well-formed."""
    msgs = conv.messages
    if conv.plain:
        return None if msgs and msgs[0].content.strip() else "empty text"
    if not msgs:
        return "empty conversation"
    start = 1 if msgs[0].role == "system" else 0
    turns = msgs[start:]
    if not turns:
        return "only a system message"
    if turns[0].role != "user":
        return f"the first turn is {turns[0].role!r}, expected 'user'"
    if not any(m.role == "assistant" for m in turns):
        return "no assistant message to learn from"
    if conv.rejected is not None and turns[-1].role != "assistant":
        return "a preference pair must end with the chosen assistant answer"
    for prev, cur in zip(turns, turns[1:], strict=False):
        if cur.role == "system":
            return "a system message after the first turn"
        if prev.role == cur.role and cur.role in ("user", "assistant"):
            return f"two {cur.role!r} messages in a row (roles must alternate)"
    for m in msgs:
        if m.role not in ROLES:
            return f"unknown role {m.role!r}"
        if not isinstance(m.content, str):
            return f"{m.role} content is {type(m.content).__name__}, expected text"
    return None
