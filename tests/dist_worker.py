"""Test helper run under torchrun: several tunesmith trainings in one launch (sharing the
process group, to save start-up time), or a rank that fails on purpose.

    python -m torch.distributed.run --nproc_per_node 2 tests/dist_worker.py runs.json
    python -m torch.distributed.run --nproc_per_node 2 tests/dist_worker.py --fail
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def run_all(spec_file: str) -> None:
    from tunesmith.config import load_config
    from tunesmith.distributed.context import shutdown_process_group
    from tunesmith.recipes.stages import run_stage  # every stage: sft, pt, dpo, kto, rm

    for overrides in json.loads(Path(spec_file).read_text()):
        run_stage(load_config(overrides=overrides))
    shutdown_process_group()


def fail_on_rank_1() -> None:
    """Rank 1 raises; rank 0 meanwhile blocks in a collective it can never finish."""
    from tunesmith.distributed.context import all_reduce_sum, init_distributed
    from tunesmith.errors import TrainingError

    ctx = init_distributed("cpu", "gloo", timeout_s=60)
    if ctx.rank == 1:
        raise TrainingError("injected failure on purpose")
    all_reduce_sum([1.0], ctx)


def main() -> None:
    from tunesmith.cli.setup import setup_process
    from tunesmith.config.environment import distributed_env
    from tunesmith.distributed.launch import run_recorded

    setup_process(0, rank=distributed_env()["rank"])
    if sys.argv[1] == "--fail":
        run_recorded(fail_on_rank_1)
    else:
        run_recorded(lambda: run_all(sys.argv[1]))


if __name__ == "__main__":
    main()
