"""Train LoRA with Unsloth's FastLanguageModel on the benchmark's rows, timing every step,
in Unsloth's own environment (this file imports nothing from tunesmith; it is run by path
with PYTHONPATH=<unsloth site>, so `import unsloth` comes before transformers and peft).

    python unsloth_runner.py SPEC.json

SPEC.json (written by unsloth_system.py) names the model folder, the rows file (.npz with
`input_ids`, `labels` [M, T] int32, `lengths` [M] and `batch_sizes` [steps]: the samples of
tunesmith's dense case in its order), the LoRA settings, the checkpointing mode and where
the result goes. The result JSON holds `status`, one `[seconds, tokens, trained]` triple per
optimizer step (CUDA synchronised), the losses and the peak allocated memory; the caller
applies tunesmith's warm-up rule to the steps.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from importlib import metadata
from typing import Any

IGNORE_INDEX = -100
VERSIONED = ("unsloth", "unsloth_zoo", "torch", "transformers", "peft", "trl", "triton",
             "bitsandbytes", "torchao")


def versions() -> dict[str, str]:
    found = {}
    for name in VERSIONED:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = "absent"
    return found


def read_batches(path: str, pad_id: int) -> list[dict[str, Any]]:
    """The micro-batches of the rows file, each right-padded to its longest sample:
    input_ids / labels / attention_mask [B, T] int64 tensors, tokens (non-pad) and
    trained (labels that are not ignored after the one-token shift)."""
    import numpy as np
    import torch

    with np.load(path) as rows:
        ids, labels = rows["input_ids"], rows["labels"]
        lengths, sizes = rows["lengths"], rows["batch_sizes"]
    batches, start = [], 0
    for size in sizes.tolist():
        lens = lengths[start:start + size]
        t = int(lens.max())
        b_ids = np.full((size, t), pad_id, dtype=np.int64)
        b_lab = np.full((size, t), IGNORE_INDEX, dtype=np.int64)
        mask = np.zeros((size, t), dtype=np.int64)
        for i, n in enumerate(lens.tolist()):
            b_ids[i, :n] = ids[start + i, :n]
            b_lab[i, :n] = labels[start + i, :n]
            mask[i, :n] = 1
        batches.append({"input_ids": torch.from_numpy(b_ids), "labels": torch.from_numpy(b_lab),
                        "attention_mask": torch.from_numpy(mask), "tokens": int(lens.sum()),
                        "trained": int((b_lab[:, 1:] != IGNORE_INDEX).sum())})
        start += size
    return batches


def train_steps(model: Any, batches: list[dict[str, Any]], record: dict[str, Any],
                lr: float, device: Any) -> None:
    """Plain AdamW (betas 0.9/0.999, no weight decay, fused on CUDA), gradients clipped at
    1.0, constant learning rate: tunesmith's defaults for the benchmark's YAML. Appends
    [seconds, tokens, trained] and the loss of every step to `record`."""
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    record["trainable_params"] = sum(p.numel() for p in params)
    cuda = device.type == "cuda"
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                            fused=cuda)
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    last = time.perf_counter()
    for batch in batches:
        inputs = {k: batch[k].to(device, non_blocking=True)
                  for k in ("input_ids", "labels", "attention_mask")}
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
            loss = model(**inputs).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        value = float(loss.item())  # synchronises with the device
        if cuda:
            torch.cuda.synchronize()
        now = time.perf_counter()
        record["steps"].append([now - last, batch["tokens"], batch["trained"]])
        record["losses"].append(value)
        last = now
    if cuda:
        record["peak_alloc_gb"] = torch.cuda.max_memory_allocated() / 1e9
        record["peak_reserved_gb"] = torch.cuda.max_memory_reserved() / 1e9


def load_model(spec: dict[str, Any]) -> tuple[Any, Any]:
    """Unsloth's 16-bit LoRA: FastLanguageModel in bf16 (no 4-bit), adapters on the
    spec's projections, checkpointing "unsloth" (offloaded) or off."""
    import torch
    import unsloth  # noqa: F401  (before transformers / peft: it patches them on import)
    from unsloth import FastLanguageModel

    model, tokenizer = FastLanguageModel.from_pretrained(
        model_name=spec["model_dir"], max_seq_length=spec["max_seq_length"],
        dtype=torch.bfloat16, load_in_4bit=False, local_files_only=True)
    gc = spec["gradient_checkpointing"]
    model = FastLanguageModel.get_peft_model(
        model, r=spec["lora_r"], lora_alpha=spec["lora_alpha"], lora_dropout=0.0, bias="none",
        target_modules=list(spec["lora_targets"]), use_gradient_checkpointing=gc,
        random_state=spec["seed"])
    FastLanguageModel.for_training(model)
    return model, tokenizer


def run(spec: dict[str, Any], record: dict[str, Any]) -> None:
    import torch

    record["status"] = "importing unsloth"
    t0 = time.perf_counter()
    try:
        model, _ = load_model(spec)
    except ImportError as exc:
        record["status"] = f"import failed: {type(exc).__name__}: {exc}"
        raise
    record["load_s"] = time.perf_counter() - t0
    record["versions"] = versions()
    record["status"] = "training"
    batches = read_batches(spec["rows"], spec["pad_id"])
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    train_steps(model, batches, record, spec["learning_rate"], device)
    record["status"] = "ok"


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[1]) as fh:
        spec = json.load(fh)
    record: dict[str, Any] = {"status": "started", "steps": [], "losses": []}
    t0 = time.perf_counter()
    try:
        run(spec, record)
    except BaseException as exc:  # the status names the failure; the log has the traceback
        traceback.print_exc()
        if not record["status"].startswith("import failed"):
            record["status"] = f"failed while {record['status']}: {type(exc).__name__}: {exc}"
        return 1
    finally:
        record["wall_s"] = time.perf_counter() - t0
        with open(spec["result"], "w") as fh:
            json.dump(record, fh)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
