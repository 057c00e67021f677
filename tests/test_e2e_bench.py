"""bench/e2e.py (`tunesmith bench --e2e`): the YAMLs both systems get, the ratio table, and
the tunesmith side end to end on a tiny CPU model (--tiny)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import yaml

from tunesmith.benchmarks.e2e import CASES, case_yaml, parse_args
from tunesmith.benchmarks.e2e_report import ratios
from tunesmith.cli.main import main


def _assets(tmp_path):
    return SimpleNamespace(model_dir=tmp_path / "m", data_dir=tmp_path / "d")


@pytest.mark.parametrize("case", [c for c in CASES if CASES[c]["llamafactory"] is not None])
def test_both_systems_get_the_same_keys(tmp_path, case):
    assets = _assets(tmp_path)
    ours = yaml.safe_load(case_yaml("tunesmith", case, assets, 10, tmp_path, False)[0]
                          .read_text())
    theirs = yaml.safe_load(case_yaml("llamafactory", case, assets, 10, tmp_path, False)[0]
                            .read_text())
    shared = set(ours) & set(theirs) - {"output_dir", "max_steps"}
    for key in shared - set(CASES[case]["llamafactory"]) - {"packing"}:
        assert ours[key] == theirs[key], key
    # the natural YAML carries no speed key for tunesmith
    speed_keys = {"attn_implementation", "torch_compile", "flash_attn", "enable_liger_kernel",
                  "gradient_checkpointing", "disable_gradient_checkpointing"}
    extra = set(CASES[case]["tunesmith"]) if isinstance(CASES[case]["tunesmith"], dict) else set()
    assert (set(ours) & speed_keys) == extra & speed_keys
    assert ours["packing"] == theirs["packing"]  # both pack, or neither


def test_ratio_table_and_lf_mfu():
    results = {"tunesmith-natural": {"tokens_per_s": 300.0, "mfu": 0.6},
               "llamafactory-natural": {"tokens_per_s": 200.0},
               "llamafactory-best": {"tokens_per_s": 150.0},
               "tunesmith-dense": {"status": "timeout after 150 s"}}
    table = ratios(results, CASES)
    assert table["natural"]["ratio"] == 1.5 and table["best"]["ratio"] == 2.0
    assert table["natural"]["llamafactory"]["mfu"] == pytest.approx(0.4)
    assert table["dense"]["ratio"] is None and "recompute" not in table
    assert "cached" not in table  # tunesmith only: first vs second time to first step


def test_unknown_case_is_refused():
    with pytest.raises(SystemExit):
        parse_args(["--cases", "fastest"])


@pytest.mark.slow
def test_tiny_e2e_through_the_cli(tmp_path):
    out = tmp_path / "out"
    assert main(["bench", "--e2e", "--tiny", "--cases", "dense", "--steps", "3",
                 "--samples", "16", "--work", str(tmp_path / "w"), "--out", str(out)]) == 0
    report = json.loads((out / "e2e.json").read_text())
    run = report["meta"]["runs"]["tunesmith-dense"]
    assert run["status"] == "ok" and run["tokens_per_s"] > 0
    assert run["attention"] == "sdpa" and run["compile"] is False  # CPU: auto stays eager
    assert "| dense |" in (out / "e2e.md").read_text()
