"""Write LLaMA-Factory's registered chat templates as tunesmith template data files.

Run with the Python of a side environment where LLaMA-Factory is installed (never with
tunesmith's own environment; tunesmith does not depend on LLaMA-Factory):

    /work/side/lf/bin/python tools/lf_templates.py [--extra-src /path/to/LLaMA-Factory/src]

Every template of the installed version is written to
src/tunesmith/resources/templates/slots/<name>.json, and the table
src/tunesmith/resources/templates/slots.json (name -> file, kind, stop words, tool format,
thinking) is rewritten. `--extra-src` adds the names that a newer source tree registers
and the installed version does not (their files record that source's version).

A template file holds only data: the slots of every part (strings with {{content}} /
{{idx}} placeholders, {"token": ...} for a token by name, {"special": "bos_token" |
"eos_token"}), the default system prompt, stop words, thought and tool-call words, the
efficient_eos / replace_eos flags, the tool format, the thinking behaviour and the kind
(plain | llama2 | reasoning | reasoning_close_only), which selects how turns are joined.
Generated files are data, checked against LLaMA-Factory's own encoder by the fixtures that
tools/lf_fixtures.py writes.
"""

from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "src" / "tunesmith" / "resources" / "templates"
KINDS = {"Template": "plain", "Llama2Template": "llama2", "ReasoningTemplate": "reasoning",
         "Glm47ReasoningTemplate": "reasoning_close_only", "MossVLTemplate": "plain"}
PARTS = ("user", "assistant", "system", "function", "observation", "prefix")


def slot_data(slot: object) -> object:
    if isinstance(slot, str):
        return slot
    if isinstance(slot, dict):
        return {"token": slot["token"]}
    if isinstance(slot, set):
        (name,) = sorted(slot)[:1]
        return {"special": name}
    raise TypeError(f"unexpected slot {slot!r}")


def template_data(name: str, tpl: object, version: str) -> dict:
    kind = KINDS.get(type(tpl).__name__)
    if kind is None:
        raise SystemExit(f"template {name}: unknown class {type(tpl).__name__}; extend KINDS")
    plugin = tpl.mm_plugin
    data = {
        "name": name,
        "source": f"LLaMA-Factory {version}",
        "kind": kind,
        "slots": {part: [slot_data(s) for s in getattr(tpl, f"format_{part}").slots]
                  for part in PARTS},
        "function_tool_format": tpl.format_function.tool_format,
        "tool_format": tpl.format_tools.tool_format,
        # a template may describe tools with plain slots instead of a tool format (phi4_mini)
        "tools_slots": ([slot_data(s) for s in tpl.format_tools.slots]
                        if type(tpl.format_tools).__name__ == "StringFormatter" else None),
        "default_system": tpl.default_system,
        "stop_words": list(tpl.stop_words),
        "thought_words": list(tpl.thought_words),
        "tool_call_words": list(tpl.tool_call_words),
        # MossVLTemplate: without a system prompt the tool text loses its leading newlines
        "tool_text_lstrip": type(tpl).__name__ == "MossVLTemplate",
        "efficient_eos": tpl.efficient_eos,
        "replace_eos": tpl.replace_eos,
        "replace_jinja_template": tpl.replace_jinja_template,
        "enable_thinking": tpl.enable_thinking,
        "preserve_thinking": tpl.preserve_thinking,
        "media": {"plugin": type(plugin).__name__,
                  "image_token": getattr(plugin, "image_token", None),
                  "video_token": getattr(plugin, "video_token", None),
                  "audio_token": getattr(plugin, "audio_token", None)},
    }
    return data


def load_templates(src: str | None) -> tuple[dict, str]:
    """TEMPLATES of the installed LLaMA-Factory, or of a source tree in a fresh process."""
    if src is None:
        module = importlib.import_module("llamafactory.data.template")
        version = importlib.import_module("llamafactory").__version__
        return module.TEMPLATES, version
    out = subprocess.run([sys.executable, __file__, "--dump"], env={"PYTHONPATH": src},
                         capture_output=True, text=True, check=True).stdout
    payload = json.loads(out)
    return payload["templates"], payload["version"]


def dump_installed() -> None:
    templates, version = load_templates(None)
    print(json.dumps({"version": version, "templates": {
        n: template_data(n, t, version) for n, t in templates.items()}}))


PROMPT_CONSTANTS = {"default": "DEFAULT", "glm4": "GLM4", "glm4_moe": "GLM4_MOE",
                    "llama3": "LLAMA3", "minimax1": "MINIMAX_M1", "minimax2": "MINIMAX_M2",
                    "qwen": "QWEN", "qwen3_5": "QWEN35", "seed_oss": "SEED", "ling": "LING",
                    "lfm2": "LFM2"}


def tool_prompts() -> dict:
    """The tool prompt texts (str.format patterns) of every tool format that has one."""
    module = importlib.import_module("llamafactory.data.tool_utils")
    return {fmt: getattr(module, f"{const}_TOOL_PROMPT")
            for fmt, const in PROMPT_CONSTANTS.items()}


def table_row(data: dict) -> dict:
    return {"file": f"slots/{data['name']}.json", "kind": data["kind"],
            "stop_words": data["stop_words"], "tool_format": data["tool_format"],
            "thinking": data["kind"].startswith("reasoning"),
            "enable_thinking": data["enable_thinking"],
            "media": data["media"]["plugin"] != "BasePlugin"}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--extra-src", help="a newer LLaMA-Factory src/ tree for extra names")
    p.add_argument("--dump", action="store_true", help=argparse.SUPPRESS)
    ns = p.parse_args()
    if ns.dump:
        dump_installed()
        return
    installed, version = load_templates(None)
    datas = {n: template_data(n, t, version) for n, t in installed.items()}
    if ns.extra_src:
        extra, _ = load_templates(ns.extra_src)
        datas.update({n: d for n, d in extra.items() if n not in datas})
    folder = OUT / "slots"
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*.json"):
        old.unlink()
    for name, data in sorted(datas.items()):
        (folder / f"{name}.json").write_text(json.dumps(data, indent=1, ensure_ascii=False)
                                             + "\n", encoding="utf-8")
    table = {name: table_row(d) for name, d in sorted(datas.items())}
    (OUT / "slots.json").write_text(json.dumps(table, indent=1, ensure_ascii=False) + "\n",
                                    encoding="utf-8")
    (OUT / "tool_prompts.json").write_text(
        json.dumps(tool_prompts(), indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {len(table)} templates ({len(installed)} from LLaMA-Factory {version})")


if __name__ == "__main__":
    main()
