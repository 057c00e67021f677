"""Tool formats: how a template describes the available tools (in the system prompt) and
how it writes an assistant's function calls, as LLaMA-Factory's `tool_format` values do.

Each format is a pair of pure functions (tools -> prompt text, calls -> call text). The
prompt texts themselves are data (resources/templates/tool_prompts.json, str.format
patterns with {tool_text} / {tool_names} / {date}). Token ids must equal LLaMA-Factory's,
so every format is covered by the template parity fixtures (tests/fixtures/templates/).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from importlib import resources
from typing import Any

from tunesmith.errors import ConfigError

Call = tuple[str, str]  # (function name, arguments as JSON text)


@cache
def tool_prompts() -> dict[str, str]:
    path = resources.files("tunesmith") / "resources" / "templates" / "tool_prompts.json"
    return json.loads(path.read_text(encoding="utf-8"))


def _dumps(x: Any, **kw: Any) -> str:
    return json.dumps(x, ensure_ascii=False, **kw)


def _unwrap(tool: dict[str, Any]) -> dict[str, Any]:
    """{"type": "function", "function": {...}} -> {...}; a bare schema stays as it is."""
    return tool.get("function", "") if tool.get("type") == "function" else tool


def _unwrap_or_self(tool: dict[str, Any]) -> dict[str, Any]:
    return tool.get("function", tool) if tool.get("type") == "function" else tool


def _wrap(tool: dict[str, Any]) -> dict[str, Any]:
    return tool if tool.get("type") == "function" else {"type": "function", "function": tool}


def _value_text(value: Any) -> str:
    return value if isinstance(value, str) else _dumps(value)


# ---- tool descriptions (system prompt) --------------------------------------------------

def _describe_default(tools: list[dict[str, Any]], today: str) -> str:
    text, names = "", []
    for tool in map(_unwrap, tools):
        params = tool["parameters"]
        lines = ""
        for name, param in params["properties"].items():
            required = ", required" if name in params.get("required", []) else ""
            enum = (", should be one of [{}]".format(", ".join(param["enum"]))
                    if param.get("enum") else "")
            items = (", where each item should be {}".format(param["items"].get("type", ""))
                     if param.get("items") else "")
            lines += (f"  - {name} ({param.get('type', '')}{required}): "
                      f"{param.get('description', '')}{enum}{items}\n")
        text += (f"> Tool Name: {tool['name']}\nTool Description: "
                 f"{tool.get('description', '')}\nTool Args:\n{lines}\n")
        names.append(tool["name"])
    return tool_prompts()["default"].format(tool_text=text, tool_names=", ".join(names))


def _describe_glm4(tools: list[dict[str, Any]], today: str) -> str:
    text = ""
    for tool in map(_unwrap, tools):
        body = _dumps(tool, indent=4)
        text += (f"\n\n## {tool['name']}\n\n{body}\n"
                 "\u5728\u8c03\u7528\u4e0a\u8ff0\u51fd\u6570\u65f6\uff0c\u8bf7\u4f7f\u7528 "
                 "Json \u683c\u5f0f\u8868\u793a\u8c03\u7528\u7684\u53c2\u6570\u3002")
    return tool_prompts()["glm4"].format(tool_text=text)


def _describe_llama3(tools: list[dict[str, Any]], today: str) -> str:
    text = "".join(_dumps(_wrap(t), indent=4) + "\n\n" for t in tools)
    return tool_prompts()["llama3"].format(date=today, tool_text=text)


def _describe_lines(key: str, wrap: Callable[[dict], dict], lead: str = "\n",
                    tail: str = "") -> Callable[[list[dict[str, Any]], str], str]:
    """Formats whose tool text is one JSON line per tool (qwen, glm4_moe, ling, ...)."""

    def describe(tools: list[dict[str, Any]], today: str) -> str:
        text = "".join(lead + _dumps(wrap(t)) + tail for t in tools)
        return tool_prompts()[key].format(tool_text=text)

    return describe


def _describe_mistral(tools: list[dict[str, Any]], today: str) -> str:
    return "[AVAILABLE_TOOLS] " + _dumps([_wrap(t) for t in tools]) + "[/AVAILABLE_TOOLS]"


def _describe_ling(tools: list[dict[str, Any]], today: str) -> str:
    return _describe_lines("ling", _wrap)(tools, today) + "\ndetailed thinking off"


def _describe_seed(tools: list[dict[str, Any]], today: str) -> str:
    return tool_prompts()["seed_oss"].format(tool_text="\n" + _dumps(tools))


def _describe_lfm2(tools: list[dict[str, Any]], today: str) -> str:
    return tool_prompts()["lfm2"].format(tool_text=_dumps([_unwrap_or_self(t) for t in tools]))


# ---- function calls (assistant turns) ----------------------------------------------------

def _calls_default(calls: list[Call]) -> str:
    return "\n".join(f"Action: {name}\nAction Input: {args}" for name, args in calls)


def _calls_glm4(calls: list[Call]) -> str:
    if len(calls) > 1:
        raise ValueError("tool_format glm4 cannot write parallel function calls")
    return f"{calls[0][0]}\n{calls[0][1]}"


def _calls_llama3(calls: list[Call]) -> str:
    objs = [{"name": n, "parameters": json.loads(a)} for n, a in calls]
    return _dumps(objs[0] if len(objs) == 1 else objs)


def _calls_mistral(calls: list[Call]) -> str:
    return _dumps([{"name": n, "arguments": json.loads(a)} for n, a in calls])


def _calls_qwen(calls: list[Call]) -> str:
    return "\n".join("<tool_call>\n" + _dumps({"name": n, "arguments": json.loads(a)})
                     + "\n</tool_call>" for n, a in calls)


def _tagged_calls(calls: list[Call], head: str, arg: str, tail: str) -> str:
    """Calls written as tags: `head` per call, `arg` per argument ({key}, {value}), then
    `tail`; calls joined by newlines ({name} in `head`)."""
    out = []
    for name, args in calls:
        text = head.format(name=name)
        for key, value in json.loads(args).items():
            text += arg.format(key=key, value=_value_text(value))
        out.append(text + tail)
    return "\n".join(out)


def _calls_qwen3_5(calls: list[Call]) -> str:
    return _tagged_calls(calls, "<tool_call>\n<function={name}>",
                         "\n<parameter={key}>\n{value}\n</parameter>",
                         "\n</function>\n</tool_call>")


def _calls_glm4_moe(calls: list[Call]) -> str:
    return _tagged_calls(calls, "\n<tool_call>{name}",
                         "\n<arg_key>{key}</arg_key>\n<arg_value>{value}</arg_value>", "")


def _calls_seed(calls: list[Call]) -> str:
    return _tagged_calls(calls, "\n<seed:tool_call>\n<function={name}",
                         "\n<parameter={key}>{value}</parameter>",
                         "\n</function>\n</seed:tool_call>")


def _calls_minimax1(calls: list[Call]) -> str:
    lines = [_dumps({"name": n, "arguments": json.loads(a)}) for n, a in calls]
    return "<tool_calls>\n" + "\n".join(lines) + "\n</tool_calls>"


def _calls_minimax2(calls: list[Call]) -> str:
    return _tagged_calls(calls, '<invoke name="{name}">',
                         '\n<parameter name="{key}">{value}</parameter>', "\n</invoke>")


def _calls_lfm2(calls: list[Call]) -> str:
    parts = []
    for name, args in calls:
        kwargs = [f'{k}="{v}"' if isinstance(v, str) else f"{k}={_dumps(v)}"
                  for k, v in json.loads(args).items()]
        parts.append(f"{name}({', '.join(kwargs)})")
    return f"<|tool_call_start|>[{', '.join(parts)}]<|tool_call_end|>"


@dataclass(frozen=True)
class ToolFormat:
    describe: Callable[[list[dict[str, Any]], str], str]  # (tools, today) -> system text
    write_calls: Callable[[list[Call]], str]


def _gemma4() -> ToolFormat:
    from tunesmith.data.tool_format_gemma import describe_gemma4, write_calls_gemma4

    return ToolFormat(describe_gemma4, write_calls_gemma4)


TOOL_FORMATS: dict[str, Callable[[], ToolFormat]] = {
    "default": lambda: ToolFormat(_describe_default, _calls_default),
    "glm4": lambda: ToolFormat(_describe_glm4, _calls_glm4),
    "llama3": lambda: ToolFormat(_describe_llama3, _calls_llama3),
    "mistral": lambda: ToolFormat(_describe_mistral, _calls_mistral),
    "qwen": lambda: ToolFormat(_describe_lines("qwen", _wrap), _calls_qwen),
    "qwen3_5": lambda: ToolFormat(_describe_lines("qwen3_5", _unwrap_or_self), _calls_qwen3_5),
    "glm4_moe": lambda: ToolFormat(_describe_lines("glm4_moe", _wrap), _calls_glm4_moe),
    "ling": lambda: ToolFormat(_describe_ling, _calls_qwen),
    "seed_oss": lambda: ToolFormat(_describe_seed, _calls_seed),
    "minimax1": lambda: ToolFormat(_describe_lines("minimax1", _unwrap, "", "\n"),
                                   _calls_minimax1),
    "minimax2": lambda: ToolFormat(_describe_lines("minimax2", _unwrap, "<tool>", "</tool>\n"),
                                   _calls_minimax2),
    "lfm2": lambda: ToolFormat(_describe_lfm2, _calls_lfm2),
    "gemma4": _gemma4,
}


def get_tool_format(name: str, where: str = "tool_format") -> ToolFormat:
    if name not in TOOL_FORMATS:
        import difflib

        near = difflib.get_close_matches(name, list(TOOL_FORMATS), n=1)
        hint = f"; did you mean {near[0]}?" if near else ""
        raise ConfigError(f"{where}: unknown tool format {name!r}; known formats are "
                          f"{', '.join(TOOL_FORMATS)}{hint}")
    return TOOL_FORMATS[name]()


def today_text() -> str:
    """The date as the llama3 tool prompt writes it ("30 Nov 2026")."""
    return datetime.now().strftime("%d %b %Y")
