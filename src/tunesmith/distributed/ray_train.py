"""Start `tunesmith train` as Ray Train workers (use_ray: true, or USE_RAY=1 as in
LLaMA-Factory) instead of torchrun.

    tunesmith train cfg.yaml  (use_ray)      the driver: ray.init(**ray_init_kwargs)
      -> TorchTrainer(ray_num_workers, resources_per_worker, placement_strategy)
           each worker: Ray sets RANK / LOCAL_RANK / WORLD_SIZE / LOCAL_WORLD_SIZE and joins
           the process group (gloo on CPU, nccl on GPUs); tunesmith's init_distributed
           finds it joined and runs the same loop as under torchrun
      -> rank 0 writes output_dir as always; Ray keeps its run record in
         ray_storage_path/ray_run_name

Ray is an optional dependency, imported only here.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tunesmith.config.environment import launch_env, ray_env_requested
from tunesmith.config.schema import Config
from tunesmith.errors import ConfigError, TrainingError

INSTALL = "pip install 'tunesmith[ray]' (Ray Train: ray[train])"


def ray_requested(cfg: Config) -> bool:
    """use_ray in the YAML, or USE_RAY=1 in the environment (LLaMA-Factory's switch)."""
    return cfg.ray.use_ray or ray_env_requested()


def import_ray() -> Any:
    """The ray module with Ray Train, or ConfigError naming the package to install."""
    try:
        import ray
        import ray.train.torch  # noqa: F401  (Ray Train: a separate part of the ray wheel)
    except ImportError as exc:
        raise ConfigError(f"use_ray: Ray Train is not installed ({exc}); {INSTALL}") from None
    return ray


def scaling_of(cfg: Config, cluster: dict[str, float]) -> dict[str, Any]:
    """ScalingConfig arguments for this config on a cluster with `cluster` resources
    (ray.cluster_resources()); asking for more than the cluster has is an error rather
    than a run that waits for resources forever."""
    r = cfg.ray
    resources = {str(k): float(v) for k, v in r.resources_per_worker.items()}
    on_cpu = cfg.training.device == "cpu"
    if not resources:
        resources = {"GPU": 1.0} if cluster.get("GPU", 0) >= 1 and not on_cpu else {"CPU": 1.0}
    use_gpu = resources.get("GPU", 0) > 0
    if use_gpu and on_cpu:
        raise ConfigError(f"resources_per_worker: {r.resources_per_worker} asks for GPUs but "
                          "device is cpu; drop GPU from it or set device: auto")
    for name, each in resources.items():
        have = cluster.get(name, 0)
        if each * r.ray_num_workers > have:
            raise ConfigError(
                f"ray_num_workers: {r.ray_num_workers} workers x {name} {each:g} need "
                f"{each * r.ray_num_workers:g} {name}, but the Ray cluster has {have:g}; lower "
                "ray_num_workers or resources_per_worker, or add nodes (ray_init_kwargs)")
    return {"num_workers": r.ray_num_workers, "use_gpu": use_gpu,
            "resources_per_worker": resources, "placement_strategy": r.placement_strategy}


def check_ray_launch(cfg: Config) -> None:
    """Ray starts the workers itself: a process that another launcher started, or
    NPROC_PER_NODE asking for torchrun, contradicts use_ray."""
    env = launch_env()
    if env.launched:
        raise ConfigError("use_ray: this process was started by a launcher (torchrun, "
                          "accelerate, deepspeed), but Ray starts its own workers; run "
                          "`tunesmith train` directly, or drop use_ray / USE_RAY")
    if env.nproc_per_node is not None or env.nnodes > 1:
        raise ConfigError("use_ray: NPROC_PER_NODE / NNODES choose torchrun processes; with "
                          f"Ray, ray_num_workers ({cfg.ray.ray_num_workers}) does; unset them")


def run_with_ray(cfg: Config, worker: Callable[[Config], dict[str, Any]]) -> Path:
    """Run `worker(cfg)` on ray_num_workers Ray Train workers (one process group);
    returns the folder of Ray's run record."""
    check_ray_launch(cfg)
    ray = import_ray()
    from ray.train import TrainingFailedError
    from ray.train.torch import TorchTrainer

    started = not ray.is_initialized()
    if started:
        ray.init(**cfg.ray.ray_init_kwargs)
    try:
        kwargs = trainer_kwargs(cfg, ray.cluster_resources(), worker)
        scaling = kwargs["scaling_config"]
        each = ", ".join(f"{v:g} {k}" for k, v in scaling.resources_per_worker.items())
        print(f"ray: {scaling.num_workers} worker(s), {each} each", flush=True)
        result = TorchTrainer(_train_worker, **kwargs).fit()
    except (TrainingFailedError, ray.exceptions.RayError) as exc:  # a worker's error
        raise TrainingError(f"Ray Train run failed: {exc}") from None
    finally:
        if started:
            ray.shutdown()
    print(f"ray: run record in {result.path}", flush=True)
    return Path(result.path)


def trainer_kwargs(cfg: Config, cluster: dict[str, float],
                   worker: Callable[[Config], dict[str, Any]]) -> dict[str, Any]:
    """TorchTrainer's arguments (besides the worker function) for this config on a
    cluster with `cluster` resources."""
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig

    scaling = scaling_of(cfg, cluster)
    backend = _backend(cfg, scaling["use_gpu"])
    return {
        "train_loop_config": {"cfg": cfg, "worker": worker, "cwd": os.getcwd()},
        "torch_config": TorchConfig(backend=backend, timeout_s=cfg.training.ddp_timeout),
        "scaling_config": ScalingConfig(**scaling),
        "run_config": RunConfig(name=cfg.ray.ray_run_name or None,
                                storage_path=str(Path(cfg.ray.ray_storage_path).resolve())),
    }


def _backend(cfg: Config, use_gpu: bool) -> str:
    """The process group's backend, chosen as under torchrun (ddp_backend; gloo beside
    nccl when FSDP offloads to the CPU)."""
    import torch

    from tunesmith.distributed.context import pick_backend
    from tunesmith.distributed.strategy import fsdp_settings

    t = cfg.training
    offload = bool(t.fsdp) and fsdp_settings(t).cpu_offload
    return pick_backend(t.ddp_backend, torch.device("cuda" if use_gpu else "cpu"), offload)


def _train_worker(config: dict[str, Any]) -> None:
    """One Ray Train worker: the same training as a torchrun rank, then its numbers
    reported to Ray (every worker reports: Ray's report is collective)."""
    import ray.train

    if Path(config["cwd"]).is_dir():  # relative paths in the YAML mean the driver's folder
        os.chdir(config["cwd"])
    out = config["worker"](config["cfg"])
    ray.train.report({k: v for k, v in (out or {}).items()
                      if isinstance(v, int | float | str | bool)})
