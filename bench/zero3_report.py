"""Table of a bench/z3_sweep.sh call: one row per variant, with its ratio to the plain
compiled loop of the same call. Reads <dir>/<variant>/dist_bench.json; writes
<dir>/zero3.json and zero3.md.

    python bench/zero3_report.py $OUT/z3
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

KEYS = ("step_s", "tokens_per_s", "mfu", "peak_mem_gb_per_gpu", "final_loss", "zero",
        "torch_compile", "zero3_whole_layers")


def collect(folder: Path) -> dict:
    runs, machine = [], {}
    for path in sorted(folder.glob("*/dist_bench.json")):
        report = json.loads(path.read_text())
        machine = report.get("machine", machine)
        for r in report["results"]:
            row = {"variant": path.parent.name, "status": r.get("status")}
            row.update({k: r[k] for k in KEYS if k in r})
            runs.append(row)
    return {"machine": machine, "runs": runs}


def with_ratios(report: dict, baseline: str = "plain_compiled") -> dict:
    base = next((r for r in report["runs"] if r["variant"] == baseline
                 and r.get("status") == "ok"), None)
    for r in report["runs"]:
        ok = base is not None and r.get("status") == "ok"
        r["ratio_to_plain_compiled"] = (round(r["tokens_per_s"] / base["tokens_per_s"], 3)
                                        if ok else None)
    return report


def table(report: dict) -> list[str]:
    lines = ["| variant | ZeRO-3 layers whole | compiled | zero_optimization sizes in effect | step s | tokens/s "
             "| MFU | peak GB | vs plain compiled |", "|" + "---|" * 9]
    for r in report["runs"]:
        if r.get("status") != "ok":
            lines.append(f"| {r['variant']} | | | | | | | | {r.get('status')} |")
            continue
        whole, mfu = r.get("zero3_whole_layers"), r.get("mfu")
        lines.append(
            f"| {r['variant']} | {'-' if whole is None else whole} | "
            f"{'yes' if r.get('torch_compile') else 'no'} | "
            f"{', '.join(r.get('zero') or []) or '-'} | {r['step_s']} | "
            f"{r['tokens_per_s']:,.0f} | {'n/a' if mfu is None else f'{mfu:.1%}'} | {r['peak_mem_gb_per_gpu']} | "
            f"{r['ratio_to_plain_compiled']} |")
    return lines


def main(folder: Path) -> None:
    report = with_ratios(collect(folder))
    (folder / "zero3.json").write_text(json.dumps(report, indent=2))
    md = ["# ZeRO-3 against the plain loop (one GPU)", "",
          f"machine: {json.dumps(report['machine'])}", ""] + table(report)
    (folder / "zero3.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
