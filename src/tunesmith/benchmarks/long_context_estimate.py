"""Paper estimate of one LoRA step on a single row of L tokens with offloaded checkpointing
(`gradient_checkpointing: offload`, the chunked linear cross-entropy), from the model's
shape alone. The long-context benchmark prints it beside what it measured.

    GPU  = weights + LoRA state (fp32 weights, gradients, Adam moments)
         + one decoder layer's recompute working set (all its saved tensors at once, plus
           the gradients alive in its backward)
         + the loss (final hidden rows, one [C, V] fp32 logits chunk) + the residual gradient
    host = every decoder layer's input [L, H] bf16 (pinned) + what the loss and the final
           norm save (they run inside the same offload context)

The working set is an eager upper bound (RMSNorm's fp32 copies and the four [L, I] tensors
of the SwiGLU MLP all saved); compiled layers fuse some of them away. FLOPs are models/flops.py's
count (4 N L + 6 layers d L^2 for a frozen base), written out again so the benchmark can
check the run summary's figure against it.
"""

from __future__ import annotations

from typing import Any

from tunesmith.train.throughput import PEAK_BF16_FLOPS

BF16, FP32 = 2, 4
GB = 1e9


def shape_dims(cfg: dict[str, Any]) -> dict[str, int]:
    """The dimensions the estimate needs, from a config.json-like dict."""
    h, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
    head_dim = int(cfg.get("head_dim") or h // heads)
    return {"hidden": h, "inter": int(cfg["intermediate_size"]),
            "layers": int(cfg["num_hidden_layers"]), "q_width": heads * head_dim,
            "kv_width": int(cfg.get("num_key_value_heads") or heads) * head_dim,
            "vocab": int(cfg["vocab_size"]), "tied": int(bool(cfg.get("tie_word_embeddings")))}


def matmul_params(d: dict[str, int]) -> int:
    """Weights of the decoder's linear layers and the output head (models/flops.py's N)."""
    h = d["hidden"]
    per_layer = h * d["q_width"] * 2 + h * d["kv_width"] * 2 + 3 * h * d["inter"]
    return d["layers"] * per_layer + d["vocab"] * h


def lora_step_flops(d: dict[str, int], t: int) -> float:
    """FLOPs credited to one LoRA step on one row of t tokens, written out here (not taken
    from models/flops.py, whose count of the run this checks): forward 2 N t + activation
    gradients 2 N t, and causal attention's QK^T and PV, forward 2 layers d t^2 and
    backward 4 layers d t^2."""
    return 4.0 * matmul_params(d) * t + 6.0 * d["layers"] * d["q_width"] * t * t


def lora_params(d: dict[str, int], rank: int) -> int:
    """LoRA A and B of all seven projections of every layer."""
    h, q, kv, i = d["hidden"], d["q_width"], d["kv_width"], d["inter"]
    pairs = [(h, q), (h, kv), (h, kv), (q, h), (h, i), (h, i), (i, h)]
    return d["layers"] * rank * sum(a + b for a, b in pairs)


def layer_working_set(d: dict[str, int], t: int) -> float:
    """Bytes one checkpointed layer holds during its recompute + backward (eager bound):
    input; two RMSNorms (fp32 input + bf16 output each); q, k, v before and after RoPE;
    attention output; gate, up, silu(gate), silu(gate) * up; then two [L, I] gradients and
    the [L, H] residual gradient in flight."""
    h, kv, i = d["hidden"], d["kv_width"], d["inter"]
    saved = BF16 * t * h + 2 * (FP32 + BF16) * t * h + 2 * BF16 * t * (h + 2 * kv) \
        + BF16 * t * h + 4 * BF16 * t * i
    in_flight = 2 * BF16 * t * i + 2 * BF16 * t * h
    return float(saved + in_flight)


def paper_estimate(cfg: dict[str, Any], length: int, rank: int = 16, chunk_rows: int = 512,
                   mfu: float = 0.35, device: str = "H200") -> dict[str, float]:
    """Memory (GB) and step time of one LoRA step on one row of `length` tokens."""
    d = shape_dims(cfg)
    t, h = length, d["hidden"]
    n_matmul = matmul_params(d)
    embed = 0 if d["tied"] else d["vocab"] * h
    small = d["layers"] * (2 * h + d["q_width"] + 2 * d["kv_width"]) + h  # norms, biases
    weights = BF16 * (n_matmul + embed + small)
    lora = 4 * FP32 * lora_params(d, rank)  # fp32 weight, gradient, two Adam moments
    working = layer_working_set(d, t)
    loss = 2 * BF16 * t * h + 2 * FP32 * chunk_rows * d["vocab"]  # rows, hidden; chunk x 2
    host = d["layers"] * BF16 * t * h + BF16 * t * h + (FP32 + BF16) * t * h
    flops = lora_step_flops(d, t)
    attention = 6 * d["layers"] * d["q_width"] * t * t
    step_s = flops / (mfu * PEAK_BF16_FLOPS[device])
    return {"length": t, "weights_gb": weights / GB, "lora_state_gb": lora / GB,
            "layer_working_set_gb": working / GB, "loss_gb": loss / GB,
            "residual_grad_gb": BF16 * t * h / GB,
            "gpu_total_gb": (weights + lora + working + loss + BF16 * t * h) / GB,
            "host_offloaded_inputs_gb": d["layers"] * BF16 * t * h / GB,
            "host_total_gb": host / GB, "flops_per_step": flops,
            "attention_share": attention / flops, "mfu": mfu,
            "step_s": step_s, "tokens_per_s": t / step_s}


def estimate_lines(est: dict[str, float]) -> list[str]:
    """The estimate as a markdown table (one row per item)."""
    rows = [("weights (bf16)", est["weights_gb"]), ("LoRA r16 state (fp32 w, grad, Adam)",
                                                     est["lora_state_gb"]),
            ("one layer's recompute working set (eager bound)", est["layer_working_set_gb"]),
            ("loss: hidden rows + one [512, V] fp32 chunk", est["loss_gb"]),
            ("residual-stream gradient", est["residual_grad_gb"]),
            ("**GPU peak (estimate)**", est["gpu_total_gb"]),
            ("offloaded layer inputs, pinned host memory", est["host_offloaded_inputs_gb"]),
            ("host total (inputs + loss/final-norm saves)", est["host_total_gb"])]
    lines = [f"Paper estimate at {est['length']:,} tokens (one row, LoRA, offload):", "",
             "| item | GB |", "|---|---:|"]
    lines += [f"| {name} | {figure(gb)} |" for name, gb in rows]
    lines += ["", f"FLOPs per step (models/flops.py, s^2 term included): "
              f"{est['flops_per_step']:.3e}, attention {est['attention_share']:.0%} of them; "
              f"at {est['mfu']:.0%} MFU of {PEAK_BF16_FLOPS['H200'] / 1e12:.0f} TFLOP/s: "
              f"{figure(est['step_s'])} s per step, {est['tokens_per_s']:,.0f} tokens/s."]
    return lines


def figure(x: float) -> str:
    """One decimal for GB / seconds of real shapes, three for the tiny CPU check's."""
    return f"{x:.1f}" if abs(x) >= 1 else f"{x:.3f}"
