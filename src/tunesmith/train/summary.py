"""The run summary: figures and a bottleneck report with concrete suggestions."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from tunesmith.config.schema import Config
from tunesmith.kernels.attention import VARLEN_CALLS
from tunesmith.kernels.fused import LORA_MLP_CALLS
from tunesmith.kernels.linear_ce import compiled_loss_on
from tunesmith.models.acceleration import OFFLOAD_COUNTS
from tunesmith.models.speed import SpeedPlan, compiled_graphs


def reset_lever_counts() -> int:
    """Zero the process-wide kernel counters at the start of a run; returns the number of
    compiled graphs so far (the baseline for this run's count)."""
    VARLEN_CALLS.clear()
    OFFLOAD_COUNTS.clear()
    LORA_MLP_CALLS.clear()
    return compiled_graphs()


def speed_report(plan: SpeedPlan, started: float, first_step_end: float | None,
                 graphs_before: int = 0) -> dict[str, Any]:
    """The levers as resolved, with what ran: attention calls, recompute runs, offloaded
    bytes, compiled layers and graphs; seconds from the start of the run to the end of
    step 1."""
    plan.stats.compiled_graphs = compiled_graphs() - graphs_before
    out = plan.report()
    out["varlen_calls"] = dict(VARLEN_CALLS)
    out["offloaded_mb"] = OFFLOAD_COUNTS["bytes"] / 1e6
    out["fused_lora_mlp_calls"] = LORA_MLP_CALLS["eager"] + LORA_MLP_CALLS["packed"]
    out["packed_gate_up_calls"] = LORA_MLP_CALLS["packed"]  # of those, one gate|up GEMM
    out["compiled_loss"] = compiled_loss_on()
    out["time_to_first_step_s"] = (first_step_end - started) if first_step_end else None
    return out


def suggestions(cfg: Config, perf: dict[str, Any], data: dict[str, Any],
                device: torch.device) -> list[str]:
    out: list[str] = []
    if perf.get("data_wait_share", 0) > 0.05:
        out.append(f"{perf['data_wait_share']:.0%} of the time went to waiting for data: raise "
                   "dataloader_num_workers")
    out += _speed_suggestions(cfg, perf, device)
    if device.type == "cuda" and not (cfg.training.bf16 or cfg.training.fp16):
        out.append("training in fp32 on a GPU: set bf16: true for about 2x speed and half the "
                   "activation memory")
    if data.get("truncated_response"):
        out.append(f"{data['truncated_response']} response(s) were cut at cutoff_len "
                   f"{cfg.data.cutoff_len}: raise cutoff_len")
    if device.type == "cpu":
        out.append("this run used the CPU; a CUDA GPU trains orders of magnitude faster")
    return out


def _speed_suggestions(cfg: Config, perf: dict[str, Any], device: torch.device) -> list[str]:
    """Only levers that are not already pulled (a suggestion never repeats a setting)."""
    out: list[str] = []
    mfu = perf.get("steady_mfu", perf.get("mfu"))
    if mfu is None or mfu >= 0.3:
        return out
    t = cfg.training
    hint = f"MFU is {mfu:.0%} in steady state: try a larger per_device_train_batch_size"
    if t.gradient_checkpointing != "false":
        hint += (f", or gradient_checkpointing: false (now {t.gradient_checkpointing}) if "
                 "memory allows")
    out.append(hint)
    if device.type == "cuda" and not (cfg.data.packing or cfg.data.neat_packing):
        out.append("batches are padded: packing: true removes the padding work")
    if device.type == "cuda" and str(cfg.model.torch_compile) == "false":
        out.append("torch_compile is false: auto (or true) compiles the decoder layers")
    return out


def write_summary(out: Path, cfg: Config, result: Any, report: Any, device: torch.device,
                  speed: dict[str, Any] | None = None) -> dict[str, Any]:
    perf = result.throughput
    data = report.summary()
    s = result.state
    if speed and speed.get("compile") and perf.get("warmup_steps") is not None:
        # seconds the warm-up steps took beyond ordinary steps: compilation, mostly
        speed["compile_s"] = max(0.0, perf["warmup_s"]
                                 - perf["warmup_steps"] * perf["median_step_s"])
    summary = {
        "run_name": cfg.run.run_name or out.name,
        "steps": s.step, "total_steps": result.total_steps,
        "final_loss": s.last_loss, "eval_loss": result.eval_loss,
        "skipped_nonfinite_steps": s.nonfinite_total,
        "device": str(device) if device.type != "cuda" else torch.cuda.get_device_name(device),
        "performance": perf, "data": data, "speed": speed or {},
        "suggestions": suggestions(cfg, perf, data, device),
    }
    (out / "run_summary.json").write_text(json.dumps(summary, indent=2, default=float))
    print(format_summary(summary, out))
    return summary


def format_summary(summary: dict[str, Any], out: Path) -> str:
    p, d = summary["performance"], summary["data"]
    mfu_value = p.get("steady_mfu", p.get("mfu"))
    mfu = f"{mfu_value:.1%}" if mfu_value is not None else "n/a (no known peak for device)"
    lines = [
        "", f"run summary ({out})",
        f"  steps            {summary['steps']} / {summary['total_steps']}"
        f"  (skipped non-finite: {summary['skipped_nonfinite_steps']})",
        f"  final loss       {summary['final_loss']:.4f}"
        + (f"   eval loss {summary['eval_loss']:.4f}" if summary["eval_loss"] is not None
           else ""),
        f"  throughput       {p.get('steady_tokens_per_s', p['tokens_per_s']):.0f} tokens/s "
        f"steady ({p.get('steady_trained_tokens_per_s', 0):.0f} trained) on "
        f"{summary['device']}; whole run {p['tokens_per_s']:.0f} with "
        f"{p.get('warmup_steps', 0)} warm-up step(s) of {p.get('warmup_s', 0):.1f} s",
        f"  compute          {p.get('steady_tflops', p['achieved_tflops']):.3f} TFLOP/s steady,"
        f" MFU {mfu}",
        f"  peak memory      {p['peak_memory_gb']:.2f} GB ({p['peak_memory_kind']})",
        f"  data wait        {p['data_wait_share']:.1%} of the time",
        f"  samples          {d['samples']} from {d['rows']} rows; bad rows {d['bad_rows']}, "
        f"truncated {d['truncated_prompt'] + d['truncated_response']}, dropped "
        f"{d['dropped_too_long'] + d['dropped_no_trained_tokens']}",
    ]
    if d.get("packing_efficiency") is not None:
        lines.append(f"  packing          {d['packed_samples']} samples in {d['packed_rows']} "
                     f"rows, efficiency {d['packing_efficiency']:.1%}")
    lines += _format_speed(summary.get("speed") or {})
    lines += [f"  suggestion       {s}" for s in summary["suggestions"]]
    return "\n".join(lines)


def _format_speed(sp: dict[str, Any]) -> list[str]:
    if not sp:
        return []
    compiled = (f"{sp['compiled_layers']} layer(s), {sp['compile_backend']}, about "
                f"{sp.get('compile_s', 0):.0f} s" if sp["compile"] else "off")
    if sp.get("compile_fallback"):
        compiled = f"fell back to eager ({sp['compile_fallback'][:80]})"
    first = sp.get("time_to_first_step_s")
    return [f"  attention        {sp['attention']} ({sp['attention_reason']})",
            f"  recompute        {sp['checkpointing']} ({sp['checkpointed_layers']} layer(s))",
            f"  compile          {compiled} ({sp['compile_reason']})",
            f"  first step       {first:.1f} s after start" if first is not None else
            "  first step       n/a"]
