"""The ray section: Ray Train launching (LLaMA-Factory's RayArguments: use_ray, which
LLaMA-Factory reads from USE_RAY=1, ray_num_workers, ray_init_kwargs, ray_run_name,
ray_storage_path, resources_per_worker, placement_strategy)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tunesmith.config.fields import opt

Placement = Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"]


@dataclass
class RayConfig:
    use_ray: bool = opt(
        False, "Start the training as Ray Train workers (TorchTrainer) instead of torchrun; "
        "USE_RAY=1 in the environment does the same, as in LLaMA-Factory. Needs the ray "
        "extra.", advanced=True)
    ray_num_workers: int = opt(
        1, "Ray Train workers (one process each, one GPU each on a GPU cluster). Without "
        "use_ray a value other than 1 has no effect and logs a warning.", minimum=1,
        advanced=True)
    ray_init_kwargs: dict = opt(
        {}, "Arguments of ray.init (e.g. address: auto to join a running cluster, num_cpus, "
        "runtime_env); empty: a local Ray started for this run.", advanced=True)
    ray_run_name: str = opt(
        "", "Name of Ray's run record under ray_storage_path (empty: Ray picks one).",
        advanced=True)
    ray_storage_path: str = opt(
        "./saves", "Folder of Ray's run records (the model and checkpoints still go to "
        "output_dir).", advanced=True)
    resources_per_worker: dict = opt(
        {}, "Ray resources of each worker, e.g. {GPU: 1} or {CPU: 4}; empty: one GPU per "
        "worker when the cluster has GPUs (and device is not cpu), else one CPU.",
        advanced=True)
    placement_strategy: Placement = opt(
        "PACK", "How Ray places the workers on the nodes: PACK, SPREAD, STRICT_PACK or "
        "STRICT_SPREAD.", advanced=True)
