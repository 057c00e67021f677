"""The Train tab's hardware section: processes, devices and the distributed strategy.

    processes, devices, strategy (+ its options)
        -> config keys  (fsdp, deepspeed, ddp_backend)        written into the job's YAML
        -> environment  (NPROC_PER_NODE, CUDA_VISIBLE_DEVICES)  of the job's process, read by
           `tunesmith train`'s launcher exactly as when a user sets them in a shell

DeepSpeed configs are the packaged copies of examples/deepspeed/, written into the working
folder's configs/ so the job's YAML names a file the user can open and edit.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from importlib import resources
from typing import Any, Literal

from tunesmith.errors import ConfigError
from tunesmith.webui.workspace import Workspace

Strategy = Literal["single", "ddp", "fsdp2", "deepspeed"]
STRATEGIES: tuple[str, ...] = ("single", "ddp", "fsdp2", "deepspeed")
FSDP_SHARDING: tuple[str, ...] = ("full_shard", "shard_grad_op", "hybrid_shard")
DEEPSPEED_STAGES: tuple[int, ...] = (2, 3)
DDP_BACKENDS: tuple[str, ...] = ("auto", "nccl", "gloo")
_DEVICES = re.compile(r"^\d+(,\d+)*$")


@dataclass
class Hardware:
    processes: int = 1  # processes on this machine (one per GPU; CPU runs use gloo)
    devices: str = ""  # CUDA_VISIBLE_DEVICES, e.g. "0,1"; empty: all visible
    strategy: str = "single"
    fsdp_sharding: str = "full_shard"
    offload: bool = False  # FSDP2 / DeepSpeed: parameters and optimizer state on the CPU
    deepspeed_stage: int = 3
    ddp_backend: str = "auto"


def deepspeed_file(stage: int, offload: bool) -> str:
    """The packaged DeepSpeed config for a ZeRO stage (offload: stage 3 only)."""
    if stage not in DEEPSPEED_STAGES:
        raise ConfigError(f"hardware: DeepSpeed stage {stage} is not one of 2, 3")
    if offload and stage != 3:
        raise ConfigError("hardware: CPU offload with DeepSpeed needs ZeRO stage 3")
    return f"ds_z{stage}{'_offload' if offload else ''}_config.json"


def check_hardware(hw: Hardware) -> list[str]:
    """Every problem of the section at once (empty: fine)."""
    problems = []
    if hw.strategy not in STRATEGIES:
        problems.append(f"strategy: {hw.strategy!r} is not one of {', '.join(STRATEGIES)}")
    if not 1 <= int(hw.processes) <= 64:
        problems.append(f"processes: {hw.processes} must be between 1 and 64")
    if hw.strategy == "single" and int(hw.processes) != 1:
        problems.append("processes: a single-process run takes 1; pick ddp, fsdp2 or "
                        "deepspeed to use several")
    if hw.devices and not _DEVICES.match(hw.devices.replace(" ", "")):
        problems.append(f"devices: {hw.devices!r} is not a list of GPU numbers such as 0,1")
    if hw.strategy == "fsdp2" and hw.fsdp_sharding not in FSDP_SHARDING:
        problems.append(f"fsdp sharding: {hw.fsdp_sharding!r} is not one of "
                        f"{', '.join(FSDP_SHARDING)}")
    if hw.ddp_backend not in DDP_BACKENDS:
        problems.append(f"ddp_backend: {hw.ddp_backend!r} is not one of {', '.join(DDP_BACKENDS)}")
    if hw.strategy == "deepspeed":
        try:
            deepspeed_file(int(hw.deepspeed_stage), hw.offload)
        except ConfigError as exc:
            problems.append(str(exc).removeprefix("hardware: "))
    return problems


def hardware_settings(hw: Hardware, ws: Workspace) -> tuple[dict[str, Any], dict[str, str]]:
    """(config keys for the job's YAML, environment of the job's process)."""
    problems = check_hardware(hw)
    if problems:
        raise ConfigError([f"hardware: {p}" for p in problems])
    keys: dict[str, Any] = {}
    env = {"NPROC_PER_NODE": str(int(hw.processes))}
    if hw.devices:
        env["CUDA_VISIBLE_DEVICES"] = hw.devices.replace(" ", "")
    if hw.ddp_backend != "auto":
        keys["ddp_backend"] = hw.ddp_backend
    if hw.strategy == "fsdp2":
        keys["fsdp"] = [hw.fsdp_sharding] + (["offload"] if hw.offload else [])
    elif hw.strategy == "deepspeed":
        name = deepspeed_file(int(hw.deepspeed_stage), hw.offload)
        target = ws.root / "configs" / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.exists():  # the user's edits of an earlier copy are kept
            source = resources.files("tunesmith") / "resources" / "deepspeed" / name
            with resources.as_file(source) as path:
                shutil.copyfile(path, target)
        keys["deepspeed"] = str(target.relative_to(ws.root))
    return keys, env
