"""Every environment variable tunesmith reads, in one place."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from tunesmith.errors import ConfigError


def cache_root() -> Path:
    """Root of tunesmith's cache: $TUNESMITH_CACHE, else ~/.cache/tunesmith."""
    value = os.environ.get("TUNESMITH_CACHE")
    return Path(value).expanduser() if value else Path.home() / ".cache" / "tunesmith"


def hub_offline() -> bool:
    """True when the user asked Hugging Face libraries not to reach the network."""
    return any(os.environ.get(v, "").lower() in {"1", "true", "yes"}
               for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def api_key() -> str:
    """API key for `tunesmith api` ($API_KEY); empty means no key required."""
    return os.environ.get("API_KEY", "")


def webui_auth() -> str:
    """Login for `tunesmith webui` as user:password ($TUNESMITH_WEBUI_AUTH); empty: none."""
    return os.environ.get("TUNESMITH_WEBUI_AUTH", "")


def distributed_env() -> dict[str, int]:
    """torchrun's variables for this process (rank 0 of 1 when not launched by torchrun).
    deepspeed's launcher names the processes per node LOCAL_SIZE instead of
    LOCAL_WORLD_SIZE; either is read."""
    env = os.environ
    return {
        "rank": int(env.get("RANK", "0")),
        "local_rank": int(env.get("LOCAL_RANK", "0")),
        "world_size": int(env.get("WORLD_SIZE", "1")),
        "local_world_size": int(env.get("LOCAL_WORLD_SIZE") or env.get("LOCAL_SIZE") or "1"),
    }


@dataclass(frozen=True)
class LaunchEnv:
    """How `tunesmith train` should start its processes (LLaMA-Factory's variable names).

    `launched` is true when a launcher (torchrun, accelerate launch, a cluster scheduler
    running torchrun) already started this process as one rank of a group.
    """

    launched: bool
    nproc_per_node: int | None  # NPROC_PER_NODE; None: one process per visible GPU
    nnodes: int  # NNODES
    node_rank: int  # NODE_RANK
    master_addr: str  # MASTER_ADDR ("" when unset)
    master_port: int | None  # MASTER_PORT
    force_torchrun: bool  # FORCE_TORCHRUN: relaunch even with one GPU or none (CPU tests)


def launch_env() -> LaunchEnv:
    """Read the launch variables; a malformed number raises ConfigError naming it."""
    env = os.environ
    return LaunchEnv(
        launched="LOCAL_RANK" in env or "TORCHELASTIC_RUN_ID" in env,
        nproc_per_node=_int_var("NPROC_PER_NODE"),
        nnodes=_int_var("NNODES") or 1,
        node_rank=_int_var("NODE_RANK") or 0,
        master_addr=env.get("MASTER_ADDR", ""),
        master_port=_int_var("MASTER_PORT"),
        force_torchrun=env.get("FORCE_TORCHRUN", "").lower() in {"1", "true", "yes"},
    )


def ray_env_requested() -> bool:
    """USE_RAY=1: LLaMA-Factory's switch for Ray Train launching (same as use_ray: true)."""
    return os.environ.get("USE_RAY", "").lower() in {"1", "true", "yes", "y"}


def _int_var(name: str) -> int | None:
    value = os.environ.get(name, "").strip()
    if not value:
        return None
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"environment variable {name}={value!r} is not a whole number; "
                          f"unset it or give e.g. {name}=2") from None


def single_thread_tokenizers() -> None:
    """In a preprocessing worker process: one tokenizer thread per process, because the
    workers already use every core and extra threads only contend for them."""
    os.environ["TOKENIZERS_PARALLELISM"] = "false"


def use_compile_cache(folder: Path) -> Path:
    """Point torch.compile's on-disk caches (inductor's FX graphs and kernels, Triton's
    binaries) at `folder` so a second run of the same model and settings skips most of the
    compilation. A cache directory the user already chose ($TORCHINDUCTOR_CACHE_DIR) wins.
    Returns the directory in use."""
    chosen = os.environ.get("TORCHINDUCTOR_CACHE_DIR", "")
    if chosen:
        return Path(chosen)
    folder.mkdir(parents=True, exist_ok=True)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(folder)
    if not os.environ.get("TRITON_CACHE_DIR"):
        os.environ["TRITON_CACHE_DIR"] = str(folder / "triton")
    return folder


def accelerate_mixed_precision() -> str:
    """The mixed_precision of an `accelerate launch --config_file` (no, fp16, bf16, fp8),
    "" when the process was not started by accelerate."""
    return os.environ.get("ACCELERATE_MIXED_PRECISION", "").lower()


def accelerate_fsdp_env() -> dict[str, str] | None:
    """The FSDP settings `accelerate launch --config_file` passes to its processes
    (ACCELERATE_USE_FSDP and FSDP_*), or None when it did not ask for FSDP."""
    if os.environ.get("ACCELERATE_USE_FSDP", "").lower() not in {"1", "true", "yes"}:
        return None
    return {k: v for k, v in os.environ.items() if k.startswith("FSDP_")}
