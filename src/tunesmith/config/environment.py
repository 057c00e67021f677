"""Every environment variable tunesmith reads, in one place."""

from __future__ import annotations

import os
from pathlib import Path


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


def distributed_env() -> dict[str, int]:
    """torchrun's variables for this process (rank 0 of 1 when not launched by torchrun)."""
    return {
        "rank": int(os.environ.get("RANK", "0")),
        "local_rank": int(os.environ.get("LOCAL_RANK", "0")),
        "world_size": int(os.environ.get("WORLD_SIZE", "1")),
    }


def single_thread_tokenizers() -> None:
    """In a preprocessing worker process: one tokenizer thread per process, because the
    workers already use every core and extra threads only contend for them."""
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
