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


def test_ruff_lints_every_source_file():
    """ruff's default excludes skip folders named dist, build, ...: none may hide code."""
    import shutil
    import subprocess

    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    assert ruff, "ruff is part of the dev extra"
    shown = subprocess.run([ruff, "check", "src", "--show-files"], cwd=ROOT, check=True,
                           capture_output=True, text=True).stdout
    linted = {Path(line.strip()).resolve() for line in shown.splitlines()
              if line.strip().endswith(".py")}
    sources = set((ROOT / "src").rglob("*.py"))
    missed = sorted(str(p.relative_to(ROOT)) for p in sources - linted)
    assert not missed, f"ruff does not lint: {missed}"
