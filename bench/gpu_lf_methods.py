"""QLoRA and fp8 on one GPU, measured through tunesmith's own loading and training loop.

    python bench/gpu_lf_methods.py --out $OUT      # one H200, ~10 minutes
    python bench/gpu_lf_methods.py --tiny          # the same code on the CPU, in seconds

Cases (each in its own process; a failure or out-of-memory is recorded, not fatal):

    lora_bf16_7b   Qwen2.5-7B shape, bf16 base, LoRA r16 on all linear layers
    qlora_nf4_7b   the same base loaded 4-bit (quantization_bit 4, nf4, double quant)
    full_bf16_1p5b Qwen2.5-1.5B shape, full fine-tuning, bf16 autocast, fp32 masters
    full_fp8_1p5b  the same with fp8: true (torchao Float8Linear on the decoder)

Micro-batch 4 x 2048 tokens (tiny: 2 x 64), gradient checkpointing on, 3 warm-up and 10
timed steps from the loop's own clock; random weights built from configs (the QLoRA case
saves the bf16 base once under --work, default /tmp/lf_methods, and loads it through
bitsandbytes as a user's YAML would). Needs bitsandbytes (QLoRA) and torchao (fp8); a
missing package turns the case into "skipped" with the reason. Writes
$OUT/lf_methods.json and $OUT/lf_methods.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

SHAPES = {
    "7b": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
               num_attention_heads=28, num_key_value_heads=4, vocab_size=152064,
               tie_word_embeddings=False, max_position_embeddings=4096, rope_theta=1e6),
    "1p5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                 num_attention_heads=12, num_key_value_heads=2, vocab_size=151936,
                 tie_word_embeddings=True, max_position_embeddings=4096, rope_theta=1e6),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, vocab_size=384,
                 tie_word_embeddings=False, max_position_embeddings=512),
}
CASES = {  # name: (shape, finetuning type, quantization bits, fp8)
    "lora_bf16_7b": ("7b", "lora", 0, False),
    "qlora_nf4_7b": ("7b", "lora", 4, False),
    "full_bf16_1p5b": ("1p5b", "full", 0, False),
    "full_fp8_1p5b": ("1p5b", "full", 0, True),
}
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def base_model(a: argparse.Namespace, shape: str, ft: str, bits: int, device):
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    from tunesmith.models.load_options import LoadOptions
    from tunesmith.models.loader import load_causal_lm

    config = Qwen2Config(**SHAPES["tiny" if a.tiny else shape])
    cuda = device.type == "cuda"
    dtype = torch.bfloat16 if cuda and ft != "full" else torch.float32
    if not bits:
        with torch.device(device):
            return AutoModelForCausalLM.from_config(config, dtype=dtype)
    folder = a.work / f"base-{'tiny' if a.tiny else shape}"
    if not (folder / "config.json").exists():  # random bf16 weights, saved once
        with torch.device(device):
            AutoModelForCausalLM.from_config(config, dtype=dtype).save_pretrained(folder)
    return load_causal_lm(str(folder), dtype=dtype, device=device,
                          opts=LoadOptions(quantization_bit=bits))


def run_case(a: argparse.Namespace) -> dict:
    import torch

    from tunesmith.adapters.setup import prepare_trainable
    from tunesmith.cli.setup import setup_process
    from tunesmith.config.schema import Config, FinetuningConfig, TrainingConfig
    from tunesmith.models.fp8 import convert_to_fp8
    from tunesmith.recipes.sft import apply_speed_settings

    setup_process(0)
    shape, ft, bits, fp8 = CASES[a.case]
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    mb, seq = (2, 64) if a.tiny else (4, 2048)
    cfg = TrainingConfig(output_dir=str(a.work / a.case), per_device_train_batch_size=mb,
                         max_steps=a.warmup + a.steps, learning_rate=1e-5, bf16=True,
                         lr_scheduler_type="constant", logging_steps=1, save_steps=0,
                         gradient_checkpointing="true")
    model = base_model(a, shape, ft, bits, device)
    model = prepare_trainable(model, FinetuningConfig(finetuning_type=ft, lora_rank=16,
                                                      lora_alpha=32, lora_target=TARGETS), [])
    if fp8:
        convert_to_fp8(model, device)
    apply_speed_settings(model, Config(training=cfg))
    return measure(model, cfg, device, mb, seq, a)


def measure(model, cfg, device, mb: int, seq: int, a: argparse.Namespace) -> dict:
    import numpy as np
    import torch

    from tunesmith.data.encode import EncodedSample
    from tunesmith.train.loop import Trainer
    from tunesmith.train.objective import NextTokenObjective

    class Log:
        records: list[dict] = []

        def write(self, record: dict) -> None:
            self.records.append(record)

        def close(self) -> None:
            pass

    rng = np.random.default_rng(0)
    ids = rng.integers(0, model.config.vocab_size, size=(mb * cfg.max_steps, seq))
    samples = [EncodedSample(row.astype(np.int32), row.astype(np.int32)) for row in ids]
    log = Log()
    trainer = Trainer(model, NextTokenObjective(), samples, [], cfg, pad_id=0, device=device,
                      output_dir=Path(cfg.output_dir), metrics=log)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    trainer.run()
    t = {r["step"]: r["elapsed_s"] for r in log.records if "elapsed_s" in r}
    step_s = (t[a.warmup + a.steps] - t[a.warmup]) / a.steps
    peak = torch.cuda.max_memory_allocated(device) / 1e9 if device.type == "cuda" else 0.0
    return {"case": a.case, "status": "ok", "micro_batch": mb, "seq_len": seq,
            "step_s": round(step_s, 4), "tokens_per_s": round(mb * seq / step_s, 1),
            "peak_mem_gb": round(peak, 2), "final_loss": trainer.state.last_loss,
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"}


def drive(a: argparse.Namespace) -> int:
    a.out.mkdir(parents=True, exist_ok=True)
    results = []
    for name in CASES:
        cmd = [sys.executable, __file__, "--case", name, "--out", str(a.out),
               "--work", str(a.work), "--warmup", str(a.warmup), "--steps", str(a.steps)]
        cmd += ["--tiny"] if a.tiny else []
        env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), TOKENIZERS_PARALLELISM="false")
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=a.timeout)
        path = a.out / f"{name}.json"
        result = json.loads(path.read_text()) if path.exists() else {
            "case": name, "status": "failed", "log_tail": (done.stdout + done.stderr)[-1500:]}
        results.append(result)
        print(json.dumps(result), flush=True)
    (a.out / "lf_methods.json").write_text(json.dumps(results, indent=2))
    rows = ["| case | status | tokens/s | step s | peak GB | final loss |",
            "| --- | --- | --- | --- | --- | --- |"]
    rows += [f"| {r['case']} | {r['status']} | {r.get('tokens_per_s', '')} | "
             f"{r.get('step_s', '')} | {r.get('peak_mem_gb', '')} | "
             f"{r.get('final_loss', str(r.get('reason', '')).replace(chr(10), ' '))} |"
             for r in results]
    (a.out / "lf_methods.md").write_text("\n".join(rows) + "\n")
    print("\n".join(rows))
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "bench_out")))
    p.add_argument("--work", type=Path, default=Path("/tmp/lf_methods"))
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--case", default="")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--timeout", type=int, default=900)
    a = p.parse_args()
    if not a.case:
        return drive(a)
    from tunesmith.errors import TunesmithError

    try:
        result = run_case(a)
    except TunesmithError as exc:  # a missing package or device: recorded with the reason
        result = {"case": a.case, "status": "skipped", "reason": str(exc)}
    (a.out / f"{a.case}.json").write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
