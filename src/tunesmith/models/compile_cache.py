"""Compile warm-up paid once: a persistent cache for torch.compile under tunesmith's cache.

    <cache>/compile/                 inductor's FX-graph and kernel cache, Triton binaries
    <cache>/compile/artifacts/KEY.bin torch.compiler's portable "mega-cache" of one model and
                                      settings (saved after a run, loaded before the next)

KEY digests what changes the compiled code: the model's config, torch's version, the
backend, attention, recompute mode, dtype and the batch shape.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tunesmith.config.environment import use_compile_cache

log = logging.getLogger(__name__)


@dataclass
class CompileCache:
    folder: Path
    artifact: Path
    loaded: bool = False  # portable artifacts of an earlier run were loaded
    saved: bool = False

    def report(self) -> dict[str, Any]:
        return {"dir": str(self.folder), "artifacts_loaded": self.loaded,
                "artifacts_saved": self.saved}


def open_compile_cache(root: Path, settings: dict[str, Any]) -> CompileCache:
    """Point torch.compile at the cache and load this configuration's artifacts, if any."""
    folder = use_compile_cache(root / "compile")
    text = json.dumps({**settings, "torch": torch.__version__}, sort_keys=True, default=str)
    key = hashlib.sha256(text.encode()).hexdigest()[:24]
    cache = CompileCache(folder, folder / "artifacts" / f"{key}.bin")
    load = getattr(torch.compiler, "load_cache_artifacts", None)
    if load is not None and cache.artifact.is_file():
        try:
            cache.loaded = load(cache.artifact.read_bytes()) is not None
        except Exception as exc:  # a stale or foreign file: compile from scratch, say so
            log.warning("compile cache %s could not be loaded (%s); compiling afresh",
                        cache.artifact, exc)
    return cache


def save_compile_cache(cache: CompileCache) -> None:
    """Write the portable artifacts of this process's compilations (after training)."""
    save = getattr(torch.compiler, "save_cache_artifacts", None)
    if save is None:
        return
    try:
        result = save()
    except Exception as exc:
        log.warning("compile cache: saving artifacts failed (%s); the next run compiles again",
                    exc)
        return
    if result is None or not result[0]:
        return
    cache.artifact.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.artifact.with_suffix(f".{os.getpid()}.tmp")  # ranks may write at once
    tmp.write_bytes(result[0])
    tmp.replace(cache.artifact)
    cache.saved = True


def compile_settings(model: torch.nn.Module, plan: Any, batch_shape: tuple[int, int]
                     ) -> dict[str, Any]:
    """What the compiled code depends on (the cache key's contents)."""
    config = getattr(model, "config", None)
    return {"model": config.to_dict() if config is not None else type(model).__name__,
            "backend": plan.compile_backend, "attention": plan.attention,
            "checkpointing": plan.checkpointing, "reentrant": plan.reentrant,
            "dtype": str(next(model.parameters()).dtype), "batch": batch_shape}
