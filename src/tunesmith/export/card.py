"""The README model card of an export: base model, adapters, datasets and training figures,
read from what `tunesmith train` saved beside each adapter (tunesmith.json,
run_summary.json, adapter_config.json)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tunesmith import __version__


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return {}
    return value if isinstance(value, dict) else {}


def _number(value: Any, fmt: str) -> str:
    return format(value, fmt) if isinstance(value, int | float) else "n/a"


def adapter_section(path: str) -> tuple[list[str], list[str]]:
    """(markdown lines describing one adapter, its dataset names)."""
    folder = Path(path)
    info = _read_json(folder / "tunesmith.json")
    summary = _read_json(folder / "run_summary.json")
    peft_cfg = _read_json(folder / "adapter_config.json")
    datasets = [str(d) for d in info.get("dataset", [])]
    lines = [f"### `{path}`", ""]
    method = peft_cfg.get("peft_type", "LoRA")
    if peft_cfg.get("use_dora"):
        method = "DoRA"
    lines.append(f"- method: {method}, rank {peft_cfg.get('r', 'n/a')}, alpha "
                 f"{peft_cfg.get('lora_alpha', 'n/a')}, targets "
                 f"{', '.join(sorted(peft_cfg.get('target_modules') or [])) or 'n/a'}")
    lines.append(f"- datasets: {', '.join(datasets) or 'not recorded'}")
    lines.append(f"- chat template: {info.get('template', 'not recorded')}")
    if summary:
        perf = summary.get("performance", {})
        data = summary.get("data", {})
        lines += [
            f"- optimizer steps: {summary.get('steps', 'n/a')}",
            f"- final training loss: {_number(summary.get('final_loss'), '.4f')}"
            + (f", eval loss {_number(summary.get('eval_loss'), '.4f')}"
               if summary.get("eval_loss") is not None else ""),
            f"- training samples: {data.get('samples', 'n/a')}",
            f"- throughput: {_number(perf.get('tokens_per_s'), '.0f')} tokens/s on "
            f"{summary.get('device', 'n/a')}",
        ]
    else:
        lines.append("- training figures: not recorded (no run_summary.json beside the adapter)")
    return lines + [""], datasets


def render_card(base_name: str, adapters: list[str], export_kind: str,
                files: list[str]) -> str:
    """Markdown with a Hugging Face metadata header."""
    sections: list[str] = []
    datasets: list[str] = []
    for path in adapters:
        lines, names = adapter_section(path)
        sections += lines
        datasets += [n for n in names if n not in datasets]
    header = ["---", "library_name: transformers", f"base_model: {json.dumps(base_name)}",
              "tags: [tunesmith" + (", lora, merged" if adapters else "") + "]"]
    if datasets:
        header.append(f"datasets: {json.dumps(datasets)}")
    header += ["---", ""]
    body = [f"# {Path(adapters[-1]).name if adapters else Path(base_name).name} ({export_kind})",
            "", f"Exported by tunesmith {__version__}.", "",
            f"- base model: `{base_name}`",
            f"- adapters merged, in order: {', '.join(f'`{a}`' for a in adapters) or 'none'}",
            f"- datasets: {', '.join(datasets) or 'not recorded'}",
            f"- files: {', '.join(files)}", ""]
    if sections:
        body += ["## Adapters", ""] + sections
    return "\n".join(header + body)
