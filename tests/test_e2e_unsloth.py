"""Unsloth in the end-to-end benchmark (`tunesmith bench --e2e --systems ...,unsloth`): the
case keys and runner spec, the result parsing (a recorded runner record), the install and
import failures as statuses, the report's Unsloth columns, and the whole path on a tiny CPU
model through the CLI with a stand-in for Unsloth (real Unsloth needs a GPU to import)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import yaml

from tunesmith.benchmarks.e2e import CASES, case_yaml, parse_args, run_cap
from tunesmith.benchmarks.e2e_report import ratios, write_report
from tunesmith.benchmarks.unsloth_system import (
    LORA_TARGETS,
    install_unsloth,
    parse_result,
    run_unsloth,
    runner_spec,
)
from tunesmith.cli.main import main

STANDIN = Path(__file__).parent / "fixtures" / "unsloth_standin"
# a runner record as unsloth_runner.py writes it (figures from a 4 x 2048 H200 run's shape):
# the first step carries the warm-up, the other five are steady
RECORDED = {"status": "ok", "steps": [[9.5, 8192, 8000], [0.48, 8192, 8000], [0.47, 8192, 8000],
                                      [0.47, 8192, 8000], [0.49, 8192, 8000], [0.47, 8192, 8000]],
            "losses": [12.6491, 12.6, 12.5, 12.41, 12.3, 12.2002], "peak_alloc_gb": 43.6,
            "load_s": 31.0, "versions": {"unsloth": "2026.10.9"}}


def test_dense_cases_give_unsloth_tunesmiths_yaml(tmp_path):
    assets = SimpleNamespace(model_dir=tmp_path / "m", data_dir=tmp_path / "d")
    for case, gc in (("dense", False), ("dense_recompute", "unsloth")):
        ours = yaml.safe_load(case_yaml("tunesmith", case, assets, 7, tmp_path, False)[0]
                              .read_text())
        path, out = case_yaml("unsloth", case, assets, 7, tmp_path, False)
        theirs = yaml.safe_load(path.read_text())
        assert theirs == {**ours, "output_dir": str(out)} and out.name == f"unsloth-{case}"
        assert CASES[case]["unsloth"] == {"gradient_checkpointing": gc}
    assert CASES["dense_recompute"]["tunesmith"] == {"gradient_checkpointing": "offload"}
    assert all(CASES[c]["unsloth"] is None for c in ("natural", "best", "recompute", "cached"))


def test_runner_spec_is_the_yaml_lora():
    data = {"cutoff_len": 2048, "pad_id": 0, "lora_r": 16, "lora_alpha": 32.0,
            "learning_rate": 1e-4, "seed": 42}
    spec = runner_spec(Path("m"), Path("r.npz"), Path("o.json"), data, "unsloth")
    assert spec["lora_targets"] == list(LORA_TARGETS) and len(LORA_TARGETS) == 7
    assert (spec["lora_r"], spec["lora_alpha"], spec["max_seq_length"]) == (16, 32.0, 2048)
    assert spec["gradient_checkpointing"] == "unsloth" and Path(spec["rows"]).is_absolute()
    with pytest.raises(ValueError, match="gradient_checkpointing True"):
        runner_spec(Path("m"), Path("r.npz"), Path("o.json"), data, True)


def test_recorded_result_uses_tunesmiths_warmup_rule():
    r = parse_result(RECORDED, "ok")
    assert r["status"] == "ok" and (r["warmup_steps"], r["steady_steps"]) == (1, 5)
    assert r["tokens_per_s"] == pytest.approx(5 * 8192 / (0.48 + 0.47 + 0.47 + 0.49 + 0.47))
    assert (r["loss_first"], r["loss_last"], r["peak_alloc_gb"]) == (12.6491, 12.2002, 43.6)
    failed = parse_result({**RECORDED, "status": "failed while training: OOM"}, "exit 1")
    assert failed["status"] == "exit 1 (failed while training: OOM)"
    assert parse_result(RECORDED, "timeout after 9 s")["status"] == "timeout after 9 s"
    assert parse_result({"status": "training"}, "ok")["status"] == "training"


def test_install_failure_is_a_status(tmp_path):
    wheels, site = tmp_path / "wheels", tmp_path / "site"
    wheels.mkdir()
    assert "no unsloth wheel in" in install_unsloth(wheels, site, tmp_path / "i.log")
    (wheels / "unsloth-2026.10.9-py3-none-any.whl").write_bytes(b"not a zip")
    reason = install_unsloth(wheels, site, tmp_path / "i.log")
    assert reason == "pip install of the Unsloth wheels failed (see i.log)"
    (site / "unsloth-2026.10.9.dist-info").mkdir(parents=True)  # installed: pip not run
    assert install_unsloth(wheels, site, tmp_path / "i.log") is None
    shutil.copytree(STANDIN, tmp_path / "other")  # no wheels: a site holding unsloth is used
    assert install_unsloth(tmp_path / "none", tmp_path / "other", tmp_path / "i.log") is None


def test_import_failure_is_a_status(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # relative paths (a relative --work) work too
    (tmp_path / "runs").mkdir()
    spec = runner_spec(Path("m"), Path("runs/r.npz"), Path("runs/o.json"),
                       {"cutoff_len": 64, "pad_id": 0, "lora_r": 4, "lora_alpha": 8,
                        "learning_rate": 1e-4, "seed": 1}, False)
    r = run_unsloth(spec, Path("runs/u.log"), 60, tmp_path / "empty-site")
    assert r["status"] == ("exit 1 (see u.log) (import failed: ModuleNotFoundError: "
                           "No module named 'unsloth')")


def test_report_gains_unsloth_columns(tmp_path):
    ok = {"status": "ok"}
    results = {"tunesmith-dense": {**ok, "tokens_per_s": 300.0, "mfu": 0.6, "peak_alloc_gb": 40,
                                   "loss_last": 12.21234},
               "unsloth-dense": {**ok, "tokens_per_s": 250.0, "peak_alloc_gb": 43.6,
                                 "loss_first": 12.6, "loss_last": 12.2},
               "llamafactory-dense": {**ok, "tokens_per_s": 200.0, "peak_alloc_gb": 60},
               "tunesmith-natural": {**ok, "tokens_per_s": 200.0, "mfu": 0.5, "peak_alloc_gb": 50},
               "unsloth-dense_recompute": {"status": "timeout after 200 s"}}
    table = ratios(results, CASES)
    assert (table["dense"]["ratio_unsloth"], table["dense"]["ratio"]) == (1.2, 1.5)
    assert table["dense"]["unsloth"]["mfu"] == pytest.approx(0.5)
    assert "unsloth" not in table["natural"] and table["dense_recompute"]["ratio_unsloth"] is None
    meta = {"shape": "tiny", "device": "cpu", "runs": results,
            "time_to_first_step_s": {"first": None, "second_cached": None}}
    write_report(tmp_path, table, meta)
    md = (tmp_path / "e2e.md").read_text()
    assert "| case | tunesmith tok/s | GB | MFU | LLaMA-Factory tok/s | GB | MFU | ratio | " \
           "Unsloth tok/s | GB | MFU | ratio |" in md
    assert "| dense | 300 | 40.0 | 60.0% | 200 | 60.0 | 40.0% | 1.5 | 250 | 43.6 | 50.0% | 1.2 |" \
        in md
    assert "| natural | 200 | 50.0 | 50.0% | not run |  |  | n/a | - |  |  | - |" in md
    assert "dense: 12.6 -> 12.2 (tunesmith's last: 12.2123)" in md and "unsloth-dense_recompute: timeout after 200 s" in md
    del results["llamafactory-dense"]
    write_report(tmp_path, ratios(results, CASES), meta)  # no LLaMA-Factory run: no columns
    md = (tmp_path / "e2e.md").read_text()
    assert "LLaMA-Factory" not in md and "| natural |" not in md and "| dense | 300" in md
    lf_only = ratios({"tunesmith-dense": results["tunesmith-dense"],
                      "llamafactory-dense": {**ok, "tokens_per_s": 100.0}}, CASES)
    write_report(tmp_path, lf_only, meta)
    assert "Unsloth" not in (tmp_path / "e2e.md").read_text()  # no Unsloth run: no columns


def test_unknown_system_is_refused():
    with pytest.raises(SystemExit):
        parse_args(["--systems", "tunesmith,axolotl"])
    opts = parse_args(["--run-cap-s", "110", "--uns-run-cap-s", "200"])
    assert (run_cap("unsloth", opts, 500), run_cap("tunesmith", opts, 500)) == (200, 110)
    assert run_cap("unsloth", opts, 150) == 150  # never past the budget
    assert parse_args(["--tiny", "--systems", "tunesmith,llamafactory,unsloth"]).systems == \
        ["tunesmith", "unsloth"]


@pytest.mark.slow
def test_tiny_e2e_with_unsloth_through_the_cli(tmp_path):
    site, out, work = tmp_path / "site", tmp_path / "out", tmp_path / "w"
    shutil.copytree(STANDIN, site)
    assert main(["bench", "--e2e", "--tiny", "--cases", "dense_recompute", "--steps", "3",
                 "--uns-steps", "3", "--samples", "16", "--systems", "tunesmith,unsloth",
                 "--uns-site", str(site), "--uns-wheels", str(tmp_path / "none"),
                 "--work", str(work), "--out", str(out)]) == 0
    report = json.loads((out / "e2e.json").read_text())
    ours, theirs = (report["meta"]["runs"][f"{s}-dense_recompute"]
                    for s in ("tunesmith", "unsloth"))
    assert ours["status"] == "ok" and theirs["status"] == "ok", theirs
    assert theirs["steady_steps"] + theirs["warmup_steps"] == 3 and theirs["loss_first"] > 0
    assert report["cases"]["dense_recompute"]["ratio_unsloth"] > 0
    assert report["meta"]["unsloth_site_lacks"] == ["bitsandbytes", "torchao"]
    calls = json.loads((site / "calls.json").read_text())
    assert calls["transformers_imported_first"] is False
    assert calls["from_pretrained"]["load_in_4bit"] is False
    assert calls["get_peft_model"]["use_gradient_checkpointing"] == "unsloth"
    assert (calls["get_peft_model"]["r"], calls["get_peft_model"]["lora_alpha"]) == (16, 32)
    # the rows are tunesmith's samples of the same YAML: the same tokens over the 3 steps
    rows = np.load(work / "runs" / "unsloth-dense_recompute.rows.npz")
    assert rows["batch_sizes"].tolist() == [4, 4, 4] and rows["lengths"].max() <= 256
    summary = json.loads((work / "runs" / "tunesmith-dense_recompute" / "run_summary.json")
                         .read_text())
    assert summary["performance"]["tokens"] == int(rows["lengths"].sum())
    # ... in the same order: the last step's loss agrees (LoRA B starts at zero, lr 1e-4)
    assert theirs["loss_last"] == pytest.approx(summary["final_loss"], abs=2e-3)
    assert "Unsloth tok/s" in (out / "e2e.md").read_text()


@pytest.mark.slow
def test_failed_unsloth_install_leaves_the_other_runs(tmp_path):
    out = tmp_path / "out"
    assert main(["bench", "--e2e", "--tiny", "--cases", "dense", "--steps", "2",
                 "--samples", "16", "--systems", "tunesmith,unsloth",
                 "--uns-site", str(tmp_path / "site"), "--uns-wheels", str(tmp_path / "none"),
                 "--work", str(tmp_path / "w"), "--out", str(out)]) == 0
    runs = json.loads((out / "e2e.json").read_text())["meta"]["runs"]
    assert runs["tunesmith-dense"]["status"] == "ok"
    assert runs["unsloth-dense"]["status"] == f"skipped: no unsloth wheel in {tmp_path / 'none'} " \
        "(see docs/benchmarks/README.md for the list)"
    assert "| dense |" in (out / "e2e.md").read_text()
