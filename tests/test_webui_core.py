"""Web UI without a browser: the form follows the schema, paths stay inside the working
folder, and jobs launch, stop with a checkpoint, resume and finish."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest
import yaml

from tunesmith.config.loader import load_config
from tunesmith.config.schema import field_index
from tunesmith.errors import ConfigError
from tunesmith.webui.form import form_fields, form_to_config
from tunesmith.webui.jobs import RUNNING, STOPPED, JobRunner, command_line, tail_text
from tunesmith.webui.monitor import progress_text, read_run
from tunesmith.webui.workspace import Workspace, check_paths, safe_file_name


@pytest.fixture
def ws(tmp_path) -> Workspace:
    return Workspace.create(tmp_path / "work")


def test_form_has_every_schema_key_with_its_metadata():
    specs = {s.key: s for s in form_fields()}
    assert list(specs) == list(field_index())
    assert specs["finetuning_type"].choices == ("lora", "oft", "freeze", "full")
    assert specs["learning_rate"].kind == "float" and specs["learning_rate"].minimum == 0
    assert specs["lora_target"].kind == "list" and specs["adam_beta1"].advanced
    assert specs["trust_remote_code"].default is False


def test_form_values_round_trip_through_the_cli_loader(tmp_path):
    values = {"model_name_or_path": "models/tiny", "dataset": ["data/a.json", "identity"],
              "learning_rate": 0.001, "lora_rank": 4.0, "dataset_vars": "{name: Tuney}",
              "lora_target": "q_proj, v_proj", "bf16": False, "finetuning_type": "lora"}
    changed, cfg = form_to_config(values)
    # defaults are left out of the YAML, everything else is kept with its type
    assert changed == {"model_name_or_path": "models/tiny", "dataset": ["data/a.json", "identity"],
                       "dataset_vars": {"name": "Tuney"}, "lora_rank": 4,
                       "lora_target": ["q_proj", "v_proj"], "learning_rate": 0.001}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(changed))
    assert load_config(path) == cfg


def test_form_refuses_what_the_cli_refuses():
    with pytest.raises(ConfigError) as err:
        form_to_config({"learning_rate": -1.0, "finetuning_type": "qlora", "lora_dropout": 2})
    text = str(err.value)
    assert "learning_rate" in text and "qlora" in text and "lora_dropout" in text
    with pytest.raises(ConfigError, match="unknown key"):
        form_to_config({"--output_dir": "x"})


def test_text_that_looks_like_arguments_stays_a_value():
    changed, cfg = form_to_config({"model_name_or_path": "--trust_remote_code",
                                   "dataset": "a --output_dir /etc"})
    assert cfg.model.trust_remote_code is False
    assert changed == {"model_name_or_path": "--trust_remote_code",
                       "dataset": ["a --output_dir /etc"]}


def test_upload_lands_in_the_data_folder_and_inspect_counts_rows(ws, tiny_llama_dir,
                                                                  alpaca_file):
    from tunesmith.config.schema import DataConfig
    from tunesmith.webui.data_tab import DataActions
    from tunesmith.webui.data_view import inspect_dataset

    actions = DataActions(ws)
    message, _ = actions.upload(str(alpaca_file))
    assert (ws.data_dir / alpaca_file.name).is_file() and "data/train.json" in message
    bad = alpaca_file.with_name("notes.docx")  # .txt is a data file (one sample per line)
    bad.write_text("x")
    assert "not a data file" in actions.upload(str(bad))[0]
    assert not (ws.data_dir / "notes.docx").exists()
    view = inspect_dataset(str(ws.data_dir / "train.json"),
                           DataConfig(dataset_dir=str(ws.data_dir), cutoff_len=36),
                           str(tiny_llama_dir), "", n_samples=2)
    f = view.figures
    assert f["rows"] == f["samples"] + f["over_cutoff"] == 24
    assert f["length_min"] <= f["length_p50"] <= f["length_max"]
    assert f["truncated_prompt"] > 0  # cutoff_len 36 cuts the longer samples
    text, label = zip(*view.samples[0], strict=True)
    assert "trained" in label and "The answer is 0." in text[label.index("trained")]


def test_paths_outside_the_working_folder_are_refused(ws, tmp_path):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (ws.root / "link").symlink_to(outside)
    flat = {"output_dir": "../escape", "dataset_dir": "/etc", "cache_dir": "~/cache",
            "adapter_name_or_path": ["saves/ok", "link/adapter"], "dataset": ["identity",
                                                                              "/etc/passwd"],
            "model_name_or_path": "Qwen/Qwen2.5-0.5B", "resume_from_checkpoint": "auto",
            "learning_rate": 1.0}
    problems = check_paths(ws, flat, known_names={"identity"})
    keys = sorted(p.split(":")[0] for p in problems)
    assert keys == ["adapter_name_or_path", "cache_dir", "dataset", "dataset_dir", "output_dir"]
    assert all("outside the working folder" in p for p in problems)
    assert check_paths(ws, {"output_dir": "saves/run", "model_name_or_path": "../m"},
                       set()) == [f"model_name_or_path: '../m' is outside the working folder "
                                  f"{ws.root}; use a path inside it (e.g. saves/my-run or "
                                  "data/file.json)"]
    assert safe_file_name("/tmp/upload/my-data.json") == "my-data.json"
    with pytest.raises(ConfigError):
        safe_file_name("..")


def test_job_command_is_an_argument_list_by_module_path(ws):
    argv = command_line("train", ws.jobs_dir / "x" / "train.yaml")
    assert argv[:4] == [sys.executable, "-m", "tunesmith", "train"] and len(argv) == 5


def test_tail_text_keeps_the_last_state_of_progress_bars(tmp_path):
    log = tmp_path / "log"
    log.write_text("start\ntrain: 1/4\rtrain: 2/4\rtrain: 4/4\r\ndone\n")
    assert tail_text(log, lines=3) == "train: 4/4\ndone\n"


def _wait(predicate, timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def test_job_stops_cleanly_with_a_resumable_checkpoint(ws, tiny_llama_dir, alpaca_file,
                                                             monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(sys.path))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # a tiny model: threads only contend
    (ws.root / "models").mkdir()
    (ws.root / "models" / "tiny").symlink_to(tiny_llama_dir)  # read only; never written
    (ws.data_dir / "train.json").write_text(alpaca_file.read_text())
    runner = JobRunner(ws)
    cfg = {"model_name_or_path": "models/tiny", "dataset": ["data/train.json"],
           "output_dir": "saves/run", "max_steps": 3000, "logging_steps": 10,
           "per_device_train_batch_size": 4, "learning_rate": 1e-3, "save_steps": 0}
    out = ws.saves_dir / "run"
    job = runner.launch("train", cfg, output_dir=str(out))
    assert yaml.safe_load(Path(job.config).read_text()) == cfg
    _wait(lambda: read_run(out).step >= 20, 120, "the first logged steps")
    assert runner.status(runner.get(job.id)) == RUNNING
    reopened = JobRunner(ws)  # a restarted web UI: finds the job through job.json and /proc
    assert reopened.latest("train").id == job.id
    assert reopened.status(reopened.get(job.id)) == RUNNING
    assert "stop requested" in reopened.stop(job.id)
    _wait(lambda: runner.status(runner.get(job.id)) != RUNNING, 120, "the job to stop")
    stopped = runner.get(job.id)
    view = read_run(out)
    assert runner.status(stopped) == STOPPED and stopped.returncode == 0
    assert view.stopped_at is not None and view.stopped_at < 3000
    assert (out / f"checkpoint-{view.stopped_at}" / "trainer_state.json").is_file()
    assert "stopped at step" in progress_text(view, "stopped")


def test_login_is_required_when_auth_is_set(ws, monkeypatch):
    import httpx

    from tunesmith.cli.webui import parse_auth
    from tunesmith.webui.app import ServerOptions, build_app, launch

    monkeypatch.setenv("TUNESMITH_WEBUI_AUTH", "ada:s3cret")
    from tunesmith.config.environment import webui_auth

    auth = parse_auth(webui_auth())
    assert auth == ("ada", "s3cret")
    with pytest.raises(ConfigError, match="user:password"):
        parse_auth("no-colon")
    assert ServerOptions().host == "127.0.0.1" and ServerOptions().share is False
    from webui_browser import free_port

    app = build_app(str(ws.root))
    port = free_port()
    launch(app, ServerOptions("127.0.0.1", port, auth), block=False)
    try:
        base = f"http://127.0.0.1:{port}"
        with httpx.Client(base_url=base, timeout=20) as client:
            assert client.get("/config").status_code == 401
            bad = client.post("/login", data={"username": "ada", "password": "nope"})
            assert bad.status_code >= 400
            good = client.post("/login", data={"username": "ada", "password": "s3cret"})
            assert good.status_code == 200
            assert client.get("/config").status_code == 200
    finally:
        app.close()
