"""The process group: who this process is, on which device, and the few collectives the
loop needs (all through torch.distributed; nothing home-made)."""

from __future__ import annotations

import datetime
import logging
from dataclasses import dataclass

import torch
import torch.distributed as dist

from tunesmith.config.environment import distributed_env
from tunesmith.errors import ConfigError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DistContext:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def nnodes(self) -> int:
        return max(1, self.world_size // max(self.local_world_size, 1))


def several_ranks() -> bool:
    """A process group with more than one rank is up."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def pick_backend(requested: str, device: torch.device, cpu_offload: bool = False) -> str:
    """ddp_backend -> a torch.distributed backend string."""
    if requested == "nccl" and device.type != "cuda":
        raise ConfigError("ddp_backend: nccl needs CUDA GPUs; this run is on the CPU, use gloo "
                          "or auto")
    if requested == "auto":
        requested = "nccl" if device.type == "cuda" else "gloo"
    if requested == "nccl" and cpu_offload:
        return "cpu:gloo,cuda:nccl"  # CPU-offloaded FSDP state is reduced on the CPU
    return requested


def init_distributed(device_request: str, backend: str = "auto", timeout_s: int = 1800,
                     cpu_offload: bool = False) -> DistContext:
    """Join the process group when launched as one of several ranks; else a 1-rank context.

    Each rank takes the GPU of its local rank. `timeout_s` (ddp_timeout) bounds every
    collective, so a rank waiting on a dead peer fails instead of hanging.
    """
    from tunesmith.models.loader import pick_device

    env = distributed_env()
    if env["world_size"] <= 1:
        return DistContext(device=pick_device(device_request))
    if torch.cuda.is_available() and device_request in ("auto", "cuda"):
        torch.cuda.set_device(env["local_rank"])
        device = torch.device("cuda", env["local_rank"])
    else:
        device = pick_device(device_request)
    if not dist.is_initialized():
        dist.init_process_group(backend=pick_backend(backend, device, cpu_offload),
                                timeout=datetime.timedelta(seconds=timeout_s),
                                device_id=device if device.type == "cuda" else None)
    return DistContext(env["rank"], env["local_rank"], env["world_size"],
                       env["local_world_size"], device)


def all_reduce_sum(values: list[float], ctx: DistContext) -> list[float]:
    """Sum a few numbers over all ranks in one collective (float64 on the rank's device)."""
    if not ctx.distributed:
        return list(values)
    return reduce_tensor(values, ctx).tolist()


def reduce_tensor(values: list[float], ctx: DistContext) -> torch.Tensor:
    """Like all_reduce_sum, but the sums stay on the device: no host synchronisation
    (a pinned, non-blocking copy: a plain one would wait for the GPU's queue)."""
    t = torch.tensor(values, dtype=torch.float64)
    if ctx.device.type == "cuda":
        t = t.pin_memory().to(ctx.device, non_blocking=True)
    if ctx.distributed:
        dist.all_reduce(t)
    return t


def broadcast_object(value: object, ctx: DistContext) -> object:
    """Rank 0's `value` on every rank (small objects only)."""
    if not ctx.distributed:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def gather_objects(value: object, ctx: DistContext) -> list[object] | None:
    """Every rank's `value`, as a list on rank 0 (None elsewhere)."""
    if not ctx.distributed:
        return [value]
    out: list[object] | None = [None] * ctx.world_size if ctx.is_main else None
    dist.gather_object(value, out, dst=0)
    return out


def barrier(ctx: DistContext) -> None:
    if ctx.distributed:
        dist.barrier()


def shutdown_process_group() -> None:
    """Leave the process group (once training is over, before the process exits)."""
    if dist.is_initialized():
        dist.destroy_process_group()
