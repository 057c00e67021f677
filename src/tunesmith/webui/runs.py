"""Finished runs and checkpoints in the workspace, and the base model + adapter of each.

A LoRA run's folder (or checkpoint) holds adapter_config.json and tunesmith.json naming
its base model; a full or freeze run's folder is itself a model folder (config.json).
"""

from __future__ import annotations

import json
from pathlib import Path

from tunesmith.errors import ConfigError
from tunesmith.models.registry import BUILTIN_MODELS
from tunesmith.runs.folder import list_checkpoints
from tunesmith.webui.workspace import Workspace


def is_adapter(folder: Path) -> bool:
    return (folder / "adapter_config.json").is_file()


def is_model(folder: Path) -> bool:
    return (folder / "config.json").is_file() and any(folder.glob("*.safetensors"))


def finished_runs(ws: Workspace) -> list[str]:
    """Run folders under saves/ holding an adapter or a model, newest first, as workspace-
    relative paths; each followed by its usable checkpoints."""
    found: list[tuple[float, str]] = []
    for run in ws.saves_dir.iterdir() if ws.saves_dir.is_dir() else []:
        if not run.is_dir():
            continue
        if is_adapter(run) or is_model(run):
            found.append((run.stat().st_mtime, ws.relative(run)))
        for ckpt in list_checkpoints(run):
            if is_adapter(ckpt):
                found.append((ckpt.stat().st_mtime, ws.relative(ckpt)))
    return [p for _, p in sorted(found, reverse=True)]


def model_choices(ws: Workspace) -> list[str]:
    """Built-in aliases and model folders under WORK/models."""
    local = ws.root / "models"
    folders = sorted(ws.relative(p) for p in local.iterdir() if is_model(p)) if (
        local.is_dir()) else []
    return list(BUILTIN_MODELS) + folders


def base_of(ws: Workspace, run: str) -> tuple[str, list[str]]:
    """(model_name_or_path, adapter_name_or_path) that load the model of a run folder or
    checkpoint, as written into an eval/export/chat config."""
    folder = ws.inside(run, "run")
    if is_adapter(folder):
        info = _tunesmith_info(folder) or _tunesmith_info(folder.parent)
        if not info.get("model_name_or_path"):
            raise ConfigError(f"run: {run!r} has an adapter but no tunesmith.json naming its "
                              "base model; give the base model by hand")
        return str(info["model_name_or_path"]), [ws.relative(folder)]
    if is_model(folder):
        return ws.relative(folder), []
    raise ConfigError(f"run: {run!r} holds neither an adapter (adapter_config.json) nor a "
                      "model (config.json + safetensors); pick a finished run or checkpoint")


def _tunesmith_info(folder: Path) -> dict:
    path = folder / "tunesmith.json"
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError:
        return {}
