"""Process setup, called once by the CLI (nothing runs at import)."""

from __future__ import annotations

import logging
import os
import random
import warnings

import numpy as np


def setup_process(seed: int | None = None, verbose: bool = False, rank: int = 0) -> None:
    """Logging, seeds and threads. Ranks other than 0 log errors only (rank 0 speaks)."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="[%(levelname)s] %(name)s: %(message)s")
    logging.getLogger("tunesmith").setLevel(logging.INFO if rank == 0 else logging.ERROR)
    for noisy in ("transformers", "peft", "accelerate", "httpx", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", category=UserWarning, module="torch")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
    if seed is not None:
        import torch

        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)
