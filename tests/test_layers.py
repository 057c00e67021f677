"""The import-layer order of docs/ARCHITECTURE.md holds for the whole package."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]
sys.path.insert(0, str(ROOT / "tools"))

from check_layers import violations  # noqa: E402


def test_no_layer_violations():
    assert violations(ROOT / "src") == []


def test_checker_catches_an_upward_import(tmp_path):
    pkg = tmp_path / "src" / "tunesmith" / "config"
    pkg.mkdir(parents=True)
    (pkg / "bad.py").write_text("from tunesmith.train.loop import Trainer\n")
    assert violations(tmp_path / "src") == [
        "config/bad.py:1: config (layer 0) imports tunesmith.train.loop (layer 3)"]
