"""`tunesmith train` with use_ray: the driver hands the checked config to Ray Train
(distributed/ray_train.py); each worker runs `train_rank`, what a torchrun rank runs."""

from __future__ import annotations

from typing import Any

from tunesmith.config.schema import Config


def train_on_ray(cfg: Config) -> int:
    from tunesmith.cli.setup import setup_process
    from tunesmith.distributed.ray_train import run_with_ray

    setup_process(cfg.training.seed)  # the driver: logging for its messages
    run_with_ray(cfg, train_rank)
    print(f"ray: training finished; output in {cfg.training.output_dir}")
    return 0


def train_rank(cfg: Config) -> dict[str, Any]:
    """One Ray Train worker (Ray has set RANK / WORLD_SIZE and joined the process group)."""
    from tunesmith.cli.setup import setup_process
    from tunesmith.config.environment import distributed_env
    from tunesmith.recipes.stages import run_stage

    setup_process(cfg.training.seed, rank=distributed_env()["rank"])
    return run_stage(cfg)
