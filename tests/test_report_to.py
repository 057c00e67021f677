"""report_to through the CLI: tensorboard events and a wandb (offline) run hold the losses
of metrics.jsonl; a missing package is a clear error naming the extra."""

from __future__ import annotations

import json
import struct
import sys

import pytest

from tunesmith.cli.main import main


def _train(tmp_path, model_dir, data, report_to: str) -> list[dict]:
    out = tmp_path / "run"
    assert main(["train", f"model_name_or_path={model_dir}", f"dataset={data}",
                 f"output_dir={out}", "max_steps=4", "logging_steps=2", "save_steps=0",
                 f"report_to={report_to}"]) == 0
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def test_tensorboard_events_hold_the_losses(tmp_path, tiny_llama_dir, alpaca_file):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    records = _train(tmp_path, tiny_llama_dir, alpaca_file, "tensorboard")
    events = EventAccumulator(str(tmp_path / "run" / "runs"))
    events.Reload()
    scalars = events.Scalars("loss")
    losses = [r for r in records if "loss" in r]
    assert [e.step for e in scalars] == [r["step"] for r in losses] == [2, 4]
    assert [e.value for e in scalars] == pytest.approx([r["loss"] for r in losses], rel=1e-6)
    assert "lr" in events.Tags()["scalars"]


def _wandb_history(run_file) -> list[dict]:
    """History rows of an offline .wandb file: LevelDB-log blocks of 32 KiB, each record
    fragment behind a 7-byte header (crc, length, type), after a 7-byte file header; the
    records are wandb's protobuf Record messages (wandb dropped its Python reader)."""
    from wandb.proto import wandb_internal_pb2

    raw, pos, frags, records = run_file.read_bytes(), 7, b"", []
    while pos + 7 <= len(raw):
        left = 32768 - pos % 32768
        _, n, kind = struct.unpack("<IHB", raw[pos:pos + 7])
        if left < 7 or (n == 0 and kind == 0):  # block padding
            pos += left
            continue
        frags, pos = frags + raw[pos + 7:pos + 7 + n], pos + 7 + n
        if kind in (1, 4):  # a full record, or the last fragment of one
            records.append(wandb_internal_pb2.Record.FromString(frags))
            frags = b""
    return [{i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
            for r in records if r.WhichOneof("record_type") == "history"]


def test_wandb_offline_run_holds_the_losses(tmp_path, tiny_llama_dir, alpaca_file, monkeypatch):
    pytest.importorskip("wandb", reason="wandb is in the dev extra")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    records = _train(tmp_path, tiny_llama_dir, alpaca_file, "wandb")
    [run_file] = (tmp_path / "run" / "wandb").glob("offline-run-*/run-*.wandb")
    logged = [(h["_step"], h["loss"]) for h in _wandb_history(run_file) if "loss" in h]
    assert logged == [(r["step"], r["loss"]) for r in records if "loss" in r]
    assert [s for s, _ in logged] == [2, 4]


def test_missing_tensorboard_names_the_extra(tmp_path, tiny_llama_dir, alpaca_file,
                                             monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import fails
    assert main(["train", f"model_name_or_path={tiny_llama_dir}", f"dataset={alpaca_file}",
                 f"output_dir={tmp_path / 'run'}", "max_steps=1", "report_to=tensorboard"]) == 1
    assert "report_to: tensorboard is not installed; pip install 'tunesmith[tensorboard]'" \
        in capsys.readouterr().err
