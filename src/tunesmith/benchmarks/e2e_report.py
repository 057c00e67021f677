"""The end-to-end benchmark's ratio table and its e2e.json / e2e.md.

Per case: every system's figures, the peers' MFU from tunesmith's FLOPs per token (the same
samples, so the same FLOPs per token), and tokens/s ratios tunesmith / peer: `ratio` against
LLaMA-Factory (the key earlier reports used), `ratio_unsloth` against Unsloth.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# peer -> (ratio key, column title)
PEERS = {"llamafactory": ("ratio", "LLaMA-Factory"), "unsloth": ("ratio_unsloth", "Unsloth")}


def ratios(results: dict[str, dict[str, Any]], cases: dict[str, dict[str, Any]]
           ) -> dict[str, Any]:
    """One row per case that some peer runs (tunesmith-only cases have no ratio)."""
    table: dict[str, Any] = {}
    for case, spec in cases.items():
        peers = [p for p in PEERS if spec.get(p) is not None]
        if not peers:
            continue
        ours = results.get(f"tunesmith-{spec['tunesmith']}" if isinstance(spec["tunesmith"], str)
                           else f"tunesmith-{case}")
        theirs = {p: results.get(f"{p}-{case}") for p in peers}
        if ours is None and all(t is None for t in theirs.values()):
            continue
        row: dict[str, Any] = {"tunesmith": ours}
        for peer in peers:
            row[peer], row[PEERS[peer][0]] = theirs[peer], _ratio(ours, theirs[peer])
        table[case] = row
    return table


def _ratio(ours: dict[str, Any] | None, theirs: dict[str, Any] | None) -> float | None:
    if not ours or not theirs or not ours.get("tokens_per_s") or not theirs.get("tokens_per_s"):
        return None
    if ours.get("mfu") is not None:
        theirs["mfu"] = ours["mfu"] * theirs["tokens_per_s"] / ours["tokens_per_s"]
    return round(ours["tokens_per_s"] / theirs["tokens_per_s"], 3)


def shown_peers(table: dict[str, Any]) -> list[str]:
    """Peers with at least one figure or failure in the table (columns of the report)."""
    return [p for p in PEERS if any(row.get(p) is not None for row in table.values())]


def write_report(out: Path, table: dict[str, Any], meta: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "e2e.json").write_text(json.dumps({"meta": meta, "cases": table}, indent=2,
                                             default=str))
    peers = shown_peers(table)
    title = " vs ".join(["tunesmith train"] + [PEERS[p][1] for p in peers])
    head = "| case | tunesmith tok/s | GB | MFU |" + "".join(
        f" {PEERS[p][1]} tok/s | GB | MFU | ratio |" for p in peers)
    lines = [f"# End-to-end: {title} ({meta['shape']})", "",
             f"{meta['device']}; LoRA r16/alpha 32 on all projections, micro-batch 4 x 2048, "
             "bf16; steady-state non-pad tokens/s; ratio = tunesmith / that system.", "",
             head, "|---|" + "---:|" * (3 + 4 * len(peers))]
    for case, row in table.items():
        if peers and not any(p in row for p in peers):
            continue  # a case only peers not in this report run
        cells = [case, *_cells(row["tunesmith"])]
        for p in peers:
            cells += [*_cells(row.get(p), p in row), _fmt_ratio(row, p)]
        lines.append("| " + " | ".join(cells) + " |")
    first = meta["time_to_first_step_s"]
    if first.get("first") and first.get("second_cached"):
        lines += ["", f"Time to the first step (natural YAML): {first['first']:.0f} s; the same "
                  f"run again with the compile cache: {first['second_cached']:.0f} s."]
    lines += _loss_lines(table)
    lines += ["", "Runs that did not finish: " + (", ".join(
        f"{k}: {v['status']}" for k, v in meta["runs"].items() if v.get("status") != "ok")
        or "none"), ""]
    (out / "e2e.md").write_text("\n".join(lines))
    print("\n".join(lines))


def _loss_lines(table: dict[str, Any]) -> list[str]:
    """First and last loss of the Unsloth runs (its runner reports them), beside tunesmith's
    last loss on the same samples."""
    found = []
    for case, row in table.items():
        theirs, ours = row.get("unsloth") or {}, row.get("tunesmith") or {}
        if theirs.get("loss_first") is None:
            continue
        tail = f" (tunesmith's last: {ours['loss_last']:.4f})" if ours.get("loss_last") else ""
        found.append(f"{case}: {theirs['loss_first']} -> {theirs['loss_last']}{tail}")
    return ["", "Unsloth loss, first -> last step: " + "; ".join(found) + "."] if found else []


def _fmt_ratio(row: dict[str, Any], peer: str) -> str:
    if peer not in row:  # that system has no run for this case
        return "-"
    value = row.get(PEERS[peer][0])
    return f"{value}" if value is not None else "n/a"


def _cells(r: dict[str, Any] | None, runs_case: bool = True) -> list[str]:
    """tok/s, GB, MFU of one run; its status when it gave no figure, '-' for no such run."""
    if not runs_case:
        return ["-", "", ""]
    if not r or not r.get("tokens_per_s"):
        return [(r or {}).get("status", "not run"), "", ""]
    mfu = f"{r['mfu']:.1%}" if r.get("mfu") is not None else "n/a"
    gb = f"{r['peak_alloc_gb']:.1f}" if r.get("peak_alloc_gb") is not None else "n/a"
    return [f"{r['tokens_per_s']:,.0f}", gb, mfu]
