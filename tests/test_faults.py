"""The fast part of the fault campaign (tools/faults.py runs the full one).

Each test runs a campaign part with small counts and requires every injected fault to end
as it should: SIGKILLs inside checkpoint writing, corrupted checkpoints, disk full in every
writer, a second run into a locked output_dir, bad rows of every kind, API fuzz and the
body limit, hostile uploads.
"""

from __future__ import annotations

import errno
import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).parents[1] / "tools"))

from faultlib import apifuzz, checkpoints, datafuzz, diskfull, uploads  # noqa: E402

from tunesmith.cli.main import main as cli_main  # noqa: E402
from tunesmith.errors import StorageError  # noqa: E402
from tunesmith.runs import folder as runs  # noqa: E402
from tunesmith.train import checkpoint as ckpt  # noqa: E402

pytestmark = pytest.mark.faults


def _all_ok(figure: dict) -> None:
    assert figure["ok"] == figure["count"] > 0, figure


def test_sigkill_at_every_point_of_checkpoint_writing_resumes_from_last_complete(tmp_path):
    points = checkpoints.crash_points(tmp_path / "probe")
    assert len(points) == 3 * 7 + 2  # 7 files (adapter folder included), before/in/after each
    _all_ok(checkpoints.crash_in_checkpoint_writes(tmp_path, len(points)))


def test_truncated_or_flipped_checkpoint_is_passed_over_and_said(tmp_path, capsys):
    _all_ok(checkpoints.corrupt_checkpoints(tmp_path, 4))
    out = capsys.readouterr().out
    assert "passing over it" in out and "using" in out and "checkpoint-10" in out


def test_disk_full_in_checkpoint_cache_export_metrics(tmp_path, tiny_tokenizer):
    _all_ok(checkpoints.disk_full_checkpoint(tmp_path, 7))
    _all_ok(diskfull.disk_full_cache(tmp_path, tiny_tokenizer, 4))
    _all_ok(diskfull.disk_full_export(tmp_path, 2))
    _all_ok(diskfull.disk_full_metrics(tmp_path, 2))


def test_data_fuzz_locates_every_bad_row_of_every_kind(tmp_path, tiny_tokenizer):
    figure = datafuzz.data_fuzz(tmp_path, tiny_tokenizer, 1000, 1500)
    _all_ok(figure)
    assert figure["count"] == 1000 and len(figure["by_kind"]) >= 12
    assert figure["good_rows_trained"] == 1500  # no good row is lost either


def test_readers_property(tmp_path):
    _all_ok(datafuzz.property_readers(60))


def test_api_fuzz_has_no_5xx_and_big_bodies_get_413(tiny_llama_dir):
    figure = apifuzz.api_fuzz(25, tiny_llama_dir)
    _all_ok(figure)
    assert not [s for s in figure["statuses"] if s >= 500]


def test_uploads_refused_and_nothing_written_outside(tmp_path):
    _all_ok(uploads.upload_campaign(tmp_path))


# ----- through the CLI -----------------------------------------------------------------
def _cfg(tmp_path: Path, model: Path, data: Path, out: Path, **keys) -> str:
    cfg = {"model_name_or_path": str(model), "dataset": str(data), "output_dir": str(out),
           "max_steps": 2, "save_steps": 1, "per_device_train_batch_size": 2,
           "lora_rank": 4, "plot_loss": False, "preprocessing_num_workers": 1, **keys}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def test_locked_output_dir_is_refused_and_stale_lock_recovered(tmp_path, tiny_llama_dir,
                                                               alpaca_file, capsys):
    out = tmp_path / "run"
    cfg = _cfg(tmp_path, tiny_llama_dir, alpaca_file, out)
    lock = runs.lock_run_folder(out)  # a live holder: this very process
    (out / "metrics.jsonl").write_text('{"step": 1}\n')
    assert cli_main(["train", cfg, "overwrite_output_dir=true"]) == 1
    err = capsys.readouterr().err
    assert "in use by another run" in err and str(out) in err
    assert (out / "metrics.jsonl").read_text() == '{"step": 1}\n'  # the first is untouched
    lock.release()

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # a run that died holding the lock
    (out / runs.LOCK_FILE).write_text(json.dumps({  # start time "1": even a reused pid
        "pid": dead.pid, "started": "1", "host": socket.gethostname()}))  # is not the holder
    assert cli_main(["train", cfg, "overwrite_output_dir=true"]) == 0
    assert f"recovered the stale lock of pid {dead.pid}" in capsys.readouterr().out
    assert not (out / runs.LOCK_FILE).exists()  # released at the end


def test_disk_full_during_training_names_path_and_free_space(tmp_path, tiny_llama_dir,
                                                             alpaca_file, capsys, monkeypatch):
    out = tmp_path / "run"
    real = ckpt.write_part

    def full(path: Path, writer) -> None:
        if path.name == "optimizer.pt" and "checkpoint-2" in str(path):
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        real(path, writer)

    monkeypatch.setattr(ckpt, "write_part", full)
    assert cli_main(["train", _cfg(tmp_path, tiny_llama_dir, alpaca_file, out,
                                   max_steps=3)]) == 1
    err = capsys.readouterr().err
    assert "disk full while writing checkpoint-2" in err and "MiB free on" in err, err
    assert [p.name for p in runs.list_checkpoints(out)] == ["checkpoint-1"]
    assert not runs.checkpoint_tmp(out, 2).exists()
    assert ckpt.pick_checkpoint(out, "auto") == out / "checkpoint-1"
    runs.lock_run_folder(out).release()  # the failed run released its lock


def test_second_lock_in_one_folder_is_refused(tmp_path):
    first = runs.lock_run_folder(tmp_path)
    with pytest.raises(StorageError, match="in use by another run"):
        runs.lock_run_folder(tmp_path)
    first.release()
    runs.lock_run_folder(tmp_path).release()


def test_api_command_body_limit_flag_answers_413(tiny_llama_dir):
    import os
    import re

    import httpx

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src")}
    env.pop("API_KEY", None)
    proc = subprocess.Popen([sys.executable, "-m", "tunesmith", "api", "--model_name_or_path",
                             str(tiny_llama_dir), "--port", "0", "--max_request_bytes", "4096"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        line = next(x for x in proc.stdout if "serving" in x)
        base = re.search(r"(http://127\.0\.0\.1:\d+/v1)", line).group(1)
        body = {"model": tiny_llama_dir.name,
                "messages": [{"role": "user", "content": "x" * 5000}]}
        big = httpx.post(f"{base}/chat/completions", json=body, timeout=30)
        assert big.status_code == 413 and "--max_request_bytes" in big.text
        body["messages"][0]["content"] = "hi"
        body["max_tokens"] = 2
        assert httpx.post(f"{base}/chat/completions", json=body, timeout=30).status_code == 200
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_torn_metrics_line_left_by_a_kill_is_cut_before_appending(tmp_path, caplog):
    from tunesmith.train.metrics import MetricsLog

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "loss": 1.0}\n{"step": 2, "lo')  # killed mid-record
    log = MetricsLog(path)
    log.write({"step": 3, "loss": 0.5})
    log.close()
    assert [json.loads(x)["step"] for x in path.read_text().splitlines()] == [1, 3]
    assert "dropped a partial last record" in caplog.text


def test_damaged_cache_entry_is_said_and_rebuilt(tmp_path, tiny_tokenizer, caplog):
    from datahelp import alpaca_rows, prepare, write_jsonl

    data = write_jsonl(tmp_path / "a.jsonl", alpaca_rows(8))
    first = prepare(tiny_tokenizer, dataset=[str(data)])
    (report,) = (tmp_path / "cache").rglob("report.json")
    report.write_text('{"rows": 8, "bad_')  # torn
    again = prepare(tiny_tokenizer, dataset=[str(data)])
    assert again.report.cache_misses == 1 and len(again.train) == len(first.train) == 8
    assert "is damaged" in caplog.text and "rebuilding" in caplog.text
