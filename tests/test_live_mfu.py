"""Live MFU: each metrics.jsonl step record carries "mfu" (model FLOPs per token x tokens/s
over the device's peak) when the peak is known, and none, with the reason said once, when it
is not (a CPU run); the first through the CLI."""

from __future__ import annotations

import json
import logging

import torch

from datahelp import alpaca_rows, write_jsonl
from tunesmith.cli.main import main
from tunesmith.train import throughput


def _steps(tmp_path, model_dir) -> list[dict]:
    train = write_jsonl(tmp_path / "train.jsonl", alpaca_rows(8))
    out = tmp_path / "run"
    assert main(["train", f"model_name_or_path={model_dir}", f"dataset={train}",
                 f"output_dir={out}", "per_device_train_batch_size=2", "max_steps=4",
                 "save_steps=0", "logging_steps=2", "lora_rank=4"]) == 0
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in lines if "loss" in r]


def test_step_records_carry_mfu_when_the_peak_is_known(tmp_path, tiny_llama_dir, monkeypatch):
    peak = 1e9  # FLOP/s: an injected peak for this CPU (no table knows one)
    monkeypatch.setattr(throughput, "device_peak_flops", lambda device: peak)
    steps = _steps(tmp_path, tiny_llama_dir)
    assert len(steps) == 2
    for r in steps:
        assert r["mfu"] > 0 and r["tokens_per_s"] > 0
    # mfu = FLOPs per second / peak; FLOPs per token of this tiny model are at least 4 N
    assert all(r["mfu"] * peak / r["tokens_per_s"] > 4 * 10_000 for r in steps)


def test_no_mfu_without_a_peak_and_the_reason_is_said_once(caplog):
    class Micro:
        n_tokens, n_targets = 100, 40

    rate = throughput.Throughput(torch.device("cpu"), flops_for=lambda micro: 1e6 * len(micro))
    assert rate.peak is None  # a CPU: no known peak
    with caplog.at_level(logging.INFO, logger="tunesmith.train.throughput"):
        for _ in range(4):
            rate.add_step([Micro()])
            record = rate.recent()
    assert record["tokens_per_s"] > 0 and "mfu" not in record
    said = [r.getMessage() for r in caplog.records if "MFU is left out" in r.getMessage()]
    assert len(said) == 1 and "peak FLOP/s of a CPU is unknown" in said[0]
    rate.peak = 1e9  # the same counters with a known peak
    assert rate.recent()["mfu"] > 0
