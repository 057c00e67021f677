"""The run summary: figures and a bottleneck report with concrete suggestions."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from tunesmith.config.schema import Config


def suggestions(cfg: Config, perf: dict[str, Any], data: dict[str, Any],
                device: torch.device) -> list[str]:
    out: list[str] = []
    if perf.get("data_wait_share", 0) > 0.05:
        out.append(f"{perf['data_wait_share']:.0%} of the time went to waiting for data: raise "
                   "dataloader_num_workers")
    mfu = perf.get("mfu")
    if mfu is not None and mfu < 0.3:
        out.append(f"MFU is {mfu:.0%}: try a larger per_device_train_batch_size, or turn "
                   "gradient_checkpointing off if memory allows")
    if device.type == "cuda" and not (cfg.training.bf16 or cfg.training.fp16):
        out.append("training in fp32 on a GPU: set bf16: true for about 2x speed and half the "
                   "activation memory")
    if data.get("truncated_response"):
        out.append(f"{data['truncated_response']} response(s) were cut at cutoff_len "
                   f"{cfg.data.cutoff_len}: raise cutoff_len")
    if device.type == "cpu":
        out.append("this run used the CPU; a CUDA GPU trains orders of magnitude faster")
    return out


def write_summary(out: Path, cfg: Config, result: Any, report: Any, device: torch.device
                  ) -> dict[str, Any]:
    perf = result.throughput
    data = report.summary()
    s = result.state
    summary = {
        "run_name": cfg.run.run_name or out.name,
        "steps": s.step, "total_steps": result.total_steps,
        "final_loss": s.last_loss, "eval_loss": result.eval_loss,
        "skipped_nonfinite_steps": s.nonfinite_total,
        "device": str(device) if device.type != "cuda" else torch.cuda.get_device_name(device),
        "performance": perf, "data": data,
        "suggestions": suggestions(cfg, perf, data, device),
    }
    (out / "run_summary.json").write_text(json.dumps(summary, indent=2, default=float))
    print(format_summary(summary, out))
    return summary


def format_summary(summary: dict[str, Any], out: Path) -> str:
    p, d = summary["performance"], summary["data"]
    mfu = f"{p['mfu']:.1%}" if p.get("mfu") is not None else "n/a (no known peak for device)"
    lines = [
        "", f"run summary ({out})",
        f"  steps            {summary['steps']} / {summary['total_steps']}"
        f"  (skipped non-finite: {summary['skipped_nonfinite_steps']})",
        f"  final loss       {summary['final_loss']:.4f}"
        + (f"   eval loss {summary['eval_loss']:.4f}" if summary["eval_loss"] is not None
           else ""),
        f"  throughput       {p['tokens_per_s']:.0f} tokens/s"
        f" ({p['trained_tokens_per_s']:.0f} trained tokens/s) on {summary['device']}",
        f"  compute          {p['achieved_tflops']:.3f} TFLOP/s achieved, MFU {mfu}",
        f"  peak memory      {p['peak_memory_gb']:.2f} GB ({p['peak_memory_kind']})",
        f"  data wait        {p['data_wait_share']:.1%} of the time",
        f"  samples          {d['samples']} from {d['rows']} rows; bad rows {d['bad_rows']}, "
        f"truncated {d['truncated_prompt'] + d['truncated_response']}, dropped "
        f"{d['dropped_too_long'] + d['dropped_no_trained_tokens']}",
    ]
    if d.get("packing_efficiency") is not None:
        lines.append(f"  packing          {d['packed_samples']} samples in {d['packed_rows']} "
                     f"rows, efficiency {d['packing_efficiency']:.1%}")
    lines += [f"  suggestion       {s}" for s in summary["suggestions"]]
    return "\n".join(lines)
