"""bench/long_context.py: escalation and its stop rules, the statuses read from a run, the
checks on the run's data report and FLOPs, the paper estimate, and the whole benchmark on a
tiny CPU model (--tiny) through the real `tunesmith train`."""

from __future__ import annotations

import json

import pytest

from tunesmith.benchmarks.long_context import escalate, main, parse_args, run_status, sample_check
from tunesmith.benchmarks.long_context_estimate import paper_estimate
from tunesmith.benchmarks.workloads import SHAPES


def test_escalation_stops_after_a_failure_and_when_the_budget_is_spent():
    outcomes = {1024: "ok", 2048: "OOM"}
    ran = []

    def one(length, cap_s):
        ran.append(length)
        return {"length": length, "status": outcomes[length]}

    runs = escalate([1024, 2048, 4096], one, budget_s=100, run_cap_s=50, min_run_s=1)
    assert ran == [1024, 2048]
    assert runs[2]["status"] == "not run: stopped after 2048 (OOM)"
    spent = escalate([1024], one, budget_s=0.5, run_cap_s=50, min_run_s=1)
    assert spent[0]["status"].startswith("not run:") and "budget" in spent[0]["status"]


def test_statuses_read_from_the_process():
    log = "step 1\ntunesmith: TrainingError: CUDA out of memory at step 1 (peak 139 GB)\n"
    assert run_status(1, log, 60) == ("OOM", "tunesmith: TrainingError: CUDA out of memory "
                                             "at step 1 (peak 139 GB)")
    assert run_status(None, "", 60)[0] == "timeout after 60 s"
    assert run_status(-9, "loading\n", 60) == ("killed by signal 9", "loading")
    assert run_status(2, "bad key\n", 60) == ("exit 2", "bad key")
    assert run_status(0, "", 60) == ("ok", "")


def test_sample_check_reads_the_data_report():
    whole = {"data": {"rows": 2, "samples": 2, "truncated_prompt": 0, "truncated_response": 0,
                      "dropped_too_long": 0, "total_tokens": 2048},
             "performance": {"tokens": 2048}}
    assert sample_check(whole, 1024, 2, 2) == "ok"
    cut = json.loads(json.dumps(whole))
    cut["data"]["truncated_response"] = 1
    assert sample_check(cut, 1024, 2, 2) == "data report truncated_response = 1, expected 0"
    assert sample_check(whole, 1000, 2, 2).startswith("data report total_tokens")


def test_paper_estimate_of_the_7b_shape_at_131072():
    est = paper_estimate(SHAPES["qwen2.5-7b"], 131072)
    assert est["weights_gb"] == pytest.approx(15.2, abs=0.05)
    assert est["host_offloaded_inputs_gb"] == pytest.approx(28 * 131072 * 3584 * 2 / 1e9)
    assert est["attention_share"] == pytest.approx(0.736, abs=0.001)
    assert est["step_s"] == pytest.approx(est["flops_per_step"] / (0.35 * 790e12))
    assert 40 < est["gpu_total_gb"] < 141  # fits one H200 with room to spare


@pytest.mark.parametrize("argv", [["--lengths", "4096,1024"], ["--lengths", "262144"],
                                  ["--steps", "1"], ["--set", "packing"],
                                  ["--lengths", "32k"]])
def test_bad_arguments_are_refused(argv):
    with pytest.raises(SystemExit):
        parse_args(argv)


def test_tiny_benchmark_through_tunesmith_train(tmp_path):
    out = tmp_path / "out"
    assert main(["--tiny", "--lengths", "512", "--steps", "2", "--work", str(tmp_path / "w"),
                 "--out", str(out)]) == 0
    report = json.loads((out / "long_context.json").read_text())
    run = report["runs"][0]
    assert run["status"] == "ok", run
    assert run["sample_check"] == "ok"  # the row arrived whole: 512 tokens after the template
    assert run["flops_check"].startswith("ok")  # FLOPs per step include the L^2 term
    assert run["checkpointing"] == "offload" and run["offloaded_gb_per_step"] > 0
    assert run["tokens_per_s"] > 0 and run["steady_steps"] == 1
    assert run["yaml"]["cutoff_len"] == 512 and run["yaml"]["per_device_train_batch_size"] == 1
    assert "steady" in (out / "long_context-512.log").read_text()  # the run's log, kept
    md = (out / "long_context.md").read_text()
    assert "| 512 |" in md and "Paper estimate" in md
