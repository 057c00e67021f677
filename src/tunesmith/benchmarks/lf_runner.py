"""Run `llamafactory-cli train <yaml>`'s code path with a timing callback, in LLaMA-Factory's
own environment (this file imports nothing from tunesmith; it is run by path).

    python lf_runner.py CONFIG.yaml RESULT.json PAD_ID

`llamafactory-cli train X.yaml` calls llamafactory.train.tuner.run_exp(), which reads the
YAML from sys.argv; this script does the same, passing one TrainerCallback through
run_exp's public `callbacks` argument. The callback times every optimizer step (CUDA
synchronised) and counts the non-pad input tokens of every forward pass with a forward
pre-hook on the model (a public PyTorch hook; nothing in LLaMA-Factory is replaced).
"""

from __future__ import annotations

import json
import sys
import time


def make_callback(pad_id: int, record: dict):
    import torch
    from transformers import TrainerCallback

    counts: list = []
    cuda = torch.cuda.is_available()

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    def count_tokens(module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is not None and torch.is_grad_enabled():
            counts.append((ids != pad_id).sum())  # stays on the device until the step ends

    class Timing(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, **kwargs):
            model.register_forward_pre_hook(count_tokens, with_kwargs=True)
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            sync()
            self.last = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            sync()
            now = time.perf_counter()
            record["steps"].append([now - self.last, int(sum(int(c) for c in counts))])
            counts.clear()
            self.last = now

        def on_train_end(self, args, state, control, **kwargs):
            if cuda:
                record["peak_alloc_gb"] = torch.cuda.max_memory_allocated() / 1e9
                record["peak_reserved_gb"] = torch.cuda.max_memory_reserved() / 1e9

    return Timing()


def steady(steps: list[list[float]], warmup: int) -> dict:
    rest = steps[warmup:] if len(steps) > warmup else steps[-1:]
    seconds = sum(s[0] for s in rest) or 1e-9
    return {"tokens_per_s": sum(s[1] for s in rest) / seconds, "steady_steps": len(rest),
            "warmup_steps": len(steps) - len(rest)}


def main() -> int:
    config, result, pad_id = sys.argv[1], sys.argv[2], int(sys.argv[3])
    record: dict = {"steps": [], "status": "started"}
    sys.argv = [sys.argv[0], config]
    from llamafactory.train.tuner import run_exp

    t0 = time.perf_counter()
    try:
        run_exp(callbacks=[make_callback(pad_id, record)])
        record["status"] = "ok"
    finally:
        record["wall_s"] = time.perf_counter() - t0
        if record["steps"]:
            record.update(steady(record["steps"], warmup=max(3, len(record["steps"]) // 10)))
        with open(result, "w") as fh:
            json.dump(record, fh)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
