"""Dataset formats -> `Conversation`. Each converter raises `RowError` with a reason.

Column names follow LLaMA-Factory's dataset_info.json ("columns" and "tags").
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tunesmith.data.conversation import Conversation, Message


class RowError(ValueError):
    """A row that cannot be converted; the message is the reason."""


@dataclass
class FormatSpec:
    """How to read one dataset: its format, column names and role tags."""

    formatting: str = "alpaca"
    columns: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    ranking: bool = False  # preference pairs: chosen / rejected answers

    def col(self, name: str) -> str:
        return self.columns.get(name, ALPACA_DEFAULT_COLUMNS.get(name, name))


ALPACA_DEFAULT_COLUMNS = {"prompt": "instruction", "query": "input", "response": "output",
                          "system": "system", "history": "history", "messages": "conversations",
                          "tools": "tools", "chosen": "chosen", "rejected": "rejected",
                          "text": "text", "images": "images", "videos": "videos"}
SHAREGPT_DEFAULT_TAGS = {"role_tag": "from", "content_tag": "value", "user_tag": "human",
                         "assistant_tag": "gpt", "observation_tag": "observation",
                         "function_tag": "function_call", "system_tag": "system"}


def _text(row: dict[str, Any], key: str, *, required: bool) -> str:
    value = row.get(key)
    if value is None:
        if required and key in row:
            raise RowError(f"column {key!r} is null, expected text")
        if required:
            raise RowError(f"missing column {key!r} (columns present: {sorted(row)})")
        return ""
    if not isinstance(value, str):
        raise RowError(f"column {key!r} is {type(value).__name__}, expected text")
    return value


def convert_alpaca(row: dict[str, Any], spec: FormatSpec) -> Conversation:
    msgs: list[Message] = []
    system = _text(row, spec.col("system"), required=False)
    if system:
        msgs.append(Message("system", system))
    history = row.get(spec.col("history")) or []
    if not isinstance(history, list):
        raise RowError(f"column {spec.col('history')!r} must be a list of [prompt, response]")
    for turn in history:
        if not (isinstance(turn, list | tuple) and len(turn) == 2
                and all(isinstance(t, str) for t in turn)):
            raise RowError(f"history entry {turn!r} is not a [prompt, response] pair of text")
        msgs += [Message("user", turn[0]), Message("assistant", turn[1])]
    prompt = _text(row, spec.col("prompt"), required=True)
    query = _text(row, spec.col("query"), required=False)
    user = f"{prompt}\n{query}" if prompt and query else (prompt or query)
    msgs.append(Message("user", user))
    if spec.ranking:
        chosen = _text(row, spec.col("chosen"), required=True)
        rejected = _text(row, spec.col("rejected"), required=True)
        return Conversation(msgs + [Message("assistant", chosen)],
                            rejected=Message("assistant", rejected))
    response = row.get(spec.col("response"))
    if isinstance(response, list) and len(response) == 2:
        raise RowError("response is a list of two answers: a preference pair needs `ranking: "
                       "true` in dataset_info.json")
    msgs.append(Message("assistant", _text(row, spec.col("response"), required=True)))
    return Conversation(msgs)


def convert_sharegpt(row: dict[str, Any], spec: FormatSpec) -> Conversation:
    tags = {**SHAREGPT_DEFAULT_TAGS, **spec.tags}
    turns = row.get(spec.col("messages"))
    if not isinstance(turns, list):
        raise RowError(f"column {spec.col('messages')!r} must be a list of messages, got "
                       f"{type(turns).__name__}")
    msgs: list[Message] = []
    system = _text(row, spec.col("system"), required=False)
    if system:
        msgs.append(Message("system", system))
    msgs += [_sharegpt_message(turn, i, tags) for i, turn in enumerate(turns)]
    conv = Conversation(msgs, tools=_parse_tools(row.get(spec.col("tools"))))
    if isinstance(row.get(spec.col("tools")), str):  # templates that paste the text as is
        conv.extra["tools_raw"] = row[spec.col("tools")]
    if spec.ranking:
        chosen, rejected = (row.get(spec.col(k)) for k in ("chosen", "rejected"))
        conv.messages.append(_sharegpt_message(chosen, "chosen", tags))
        conv.rejected = _sharegpt_message(rejected, "rejected", tags)
    return conv


def _sharegpt_message(turn: Any, i: int | str, tags: dict[str, str]) -> Message:
    role_map = {tags["user_tag"]: "user", tags["assistant_tag"]: "assistant",
                tags["observation_tag"]: "tool", tags["function_tag"]: "assistant",
                tags["system_tag"]: "system"}
    if not isinstance(turn, dict):
        raise RowError(f"message {i} is {type(turn).__name__}, expected an object")
    tag = turn.get(tags["role_tag"])
    if tag not in role_map:
        raise RowError(f"message {i}: role {tag!r} is not one of {sorted(role_map)} (set "
                       "tags.role_tag / user_tag / assistant_tag in dataset_info.json)")
    content = turn.get(tags["content_tag"])
    if not isinstance(content, str):
        raise RowError(f"message {i}: {tags['content_tag']!r} is {type(content).__name__}, "
                       "expected text")
    if tag == tags["function_tag"]:
        return Message("assistant", "", _parse_function_call(content, i))
    return Message(role_map[tag], content)  # type: ignore[arg-type]


def _parse_function_call(content: str, i: int | str) -> list[dict[str, Any]]:
    """LLaMA-Factory's function_call content: JSON {"name", "arguments"} or a list of them."""
    try:
        calls = json.loads(content)
    except json.JSONDecodeError as exc:
        raise RowError(f"message {i}: function_call is not valid JSON ({exc.msg})") from None
    calls = calls if isinstance(calls, list) else [calls]
    if not all(isinstance(c, dict) and "name" in c for c in calls):
        raise RowError(f"message {i}: function_call must be {{\"name\": ..., \"arguments\": "
                       "...}} or a list of them")
    return [{"type": "function", "function": {"name": c["name"],
                                              "arguments": c.get("arguments", {})}}
            for c in calls]


def convert_openai(row: dict[str, Any], spec: FormatSpec) -> Conversation:
    turns = row.get(spec.columns.get("messages", "messages"))
    if not isinstance(turns, list):
        raise RowError("column 'messages' must be a list of {role, content} objects")
    msgs: list[Message] = []
    for i, turn in enumerate(turns):
        if not isinstance(turn, dict) or "role" not in turn:
            raise RowError(f"message {i} has no 'role'")
        content = turn.get("content")
        if content is None and turn.get("tool_calls"):
            content = ""
        if not isinstance(content, str):
            raise RowError(f"message {i}: content is {type(content).__name__}, expected text")
        calls = turn.get("tool_calls")
        if calls is not None and not isinstance(calls, list):
            raise RowError(f"message {i}: tool_calls is {type(calls).__name__}, expected a list")
        msgs.append(Message(turn["role"], content, calls or None))
    return Conversation(msgs, tools=_parse_tools(row.get(spec.columns.get("tools", "tools"))))


def convert_text(row: dict[str, Any], spec: FormatSpec) -> Conversation:
    """Plain text for pre-training: column `text` (or the `prompt` column of an alpaca entry,
    as LLaMA-Factory's pt datasets declare it)."""
    key = spec.columns.get("prompt") or spec.columns.get("text") or "text"
    return Conversation([Message("user", _text(row, key, required=True))], plain=True)


def attach_media(row: dict[str, Any], spec: FormatSpec, conv: Conversation) -> None:
    """Copy the row's `images` / `videos` columns (LLaMA-Factory's media columns) onto the
    conversation; each must be a list (a single path is accepted as a list of one)."""
    for kind in ("images", "videos"):
        value = row.get(spec.col(kind))
        if value in (None, "", []):
            continue
        value = [value] if isinstance(value, str | dict) else value
        if not isinstance(value, list):
            raise RowError(f"column {spec.col(kind)!r} is {type(value).__name__}, expected a "
                           "list of file paths")
        setattr(conv, kind, list(value))


def _parse_tools(tools: Any) -> list[dict[str, Any]] | None:
    if tools in (None, "", []):
        return None
    if isinstance(tools, str):
        try:
            tools = json.loads(tools)
        except json.JSONDecodeError as exc:
            raise RowError(f"tools is not valid JSON: {exc.msg}") from None
    if not isinstance(tools, list):
        raise RowError("tools must be a list of tool schemas")
    return tools


CONVERTERS: dict[str, Callable[[dict[str, Any], FormatSpec], Conversation]] = {
    "alpaca": convert_alpaca,
    "sharegpt": convert_sharegpt,
    "openai": convert_openai,
    "text": convert_text,
}
