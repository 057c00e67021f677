"""Gemma 4's tool format: declarations and calls in its own object notation, where strings
are fenced by the <|"|> marker and keys are unquoted (LLaMA-Factory's `gemma4`)."""

from __future__ import annotations

import json
from typing import Any

Q = '<|"|>'  # Gemma 4's string fence


def _quoted(text: Any) -> str:
    return f"{Q}{text}{Q}"


def _properties(properties: dict[str, Any]) -> str:
    parts = []
    for name, schema in properties.items():
        items = []
        if schema.get("description"):
            items.append(f"description:{_quoted(schema['description'])}")
        if schema.get("type"):
            items.append(f"type:{_quoted(str(schema['type']).upper())}")
        parts.append(f"{name}:{{{','.join(items)}}}")
    return ",".join(parts)


def _parameters(params: dict[str, Any]) -> str:
    parts = []
    if params.get("properties"):
        parts.append(f"properties:{{{_properties(params['properties'])}}}")
    if params.get("required"):
        parts.append("required:[" + ",".join(_quoted(r) for r in params["required"]) + "]")
    if params.get("type"):
        parts.append(f"type:{_quoted(str(params['type']).upper())}")
    return ",parameters:{" + ",".join(parts) + "}"


def _response(response: dict[str, Any]) -> str:
    parts = []
    if response.get("description"):
        parts.append(f"description:{_quoted(response['description'])}")
    kind = str(response.get("type", "")).upper()
    if kind == "OBJECT":
        parts.append(f"type:{_quoted(kind)}")
    return ",response:{" + ",".join(parts) + "}"


def describe_gemma4(tools: list[dict[str, Any]], today: str) -> str:
    out = []
    for tool in tools:
        fn = tool.get("function", tool) if tool.get("type") == "function" else tool
        text = f"declaration:{fn['name']}{{description:{_quoted(fn.get('description', ''))}"
        if fn.get("parameters"):
            text += _parameters(fn["parameters"])
        if fn.get("response"):
            text += _response(fn["response"])
        out.append(text + "}")
    return "\n".join(out)


def _argument(value: Any, quote_keys: bool = True) -> str:
    if isinstance(value, str):
        return _quoted(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        items = [f"{_quoted(k) if quote_keys else k}:{_argument(value[k], quote_keys)}"
                 for k in sorted(value)]
        return "{" + ",".join(items) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(_argument(v, quote_keys) for v in value) + "]"
    if value is None:
        return "null"
    return str(value)


def write_calls_gemma4(calls: list[tuple[str, str]]) -> str:
    out = []
    for name, raw in calls:
        try:
            args: Any = json.loads(raw)
        except (TypeError, json.JSONDecodeError):
            args = raw
        text = f"<|tool_call>call:{name}{{"
        if isinstance(args, dict):
            text += ",".join(f"{k}:{_argument(args[k], quote_keys=False)}" for k in sorted(args))
        elif isinstance(args, str):
            text += args
        else:
            text += _argument(args, quote_keys=False)
        out.append(text + "}<tool_call|>")
    return "".join(out)
