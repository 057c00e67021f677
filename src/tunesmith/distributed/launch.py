"""Start `tunesmith train` as one process per GPU under torchrun, when that is needed.

    tunesmith train cfg.yaml                      (the user's command, one process)
      -> python -m torch.distributed.run --nnodes NNODES --node_rank NODE_RANK
             --nproc_per_node N --master_addr A --master_port P -m tunesmith train cfg.yaml
      -> N ranks, each running the same command with RANK/LOCAL_RANK/WORLD_SIZE set

A process that a launcher already started (torchrun, accelerate launch) is never
relaunched. torchrun's elastic agent watches the ranks: when one fails, it stops the others
on its node and prints the failing rank with its error (recorded by `run_recorded`).
"""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Callable
from typing import TypeVar

from tunesmith.config.environment import LaunchEnv
from tunesmith.errors import ConfigError

T = TypeVar("T")


def processes_to_launch(env: LaunchEnv, gpu_count: int) -> int:
    """Number of processes to start on this node; 0 means run in this process as it is."""
    if env.launched:
        return 0
    wanted = env.nproc_per_node if env.nproc_per_node is not None else max(gpu_count, 1)
    if wanted < 1:
        raise ConfigError(f"NPROC_PER_NODE={env.nproc_per_node} must be at least 1")
    if gpu_count and wanted > gpu_count:
        raise ConfigError(f"NPROC_PER_NODE={wanted} asks for more processes than the "
                          f"{gpu_count} visible GPU(s); lower it or unset it")
    if wanted > 1 or env.nnodes > 1 or env.force_torchrun:
        return wanted
    return 0


def torchrun_command(env: LaunchEnv, nproc: int, argv: list[str]) -> list[str]:
    """The torchrun command line that runs `tunesmith <argv>` as `nproc` local ranks."""
    if env.nnodes > 1 and (not env.master_addr or env.master_port is None):
        raise ConfigError(f"NNODES={env.nnodes}: set MASTER_ADDR (the address of the node with "
                          "NODE_RANK=0) and MASTER_PORT (a free port there) on every node; see "
                          "docs/distributed.md")
    if not 0 <= env.node_rank < env.nnodes:
        raise ConfigError(f"NODE_RANK={env.node_rank} must be in 0..{env.nnodes - 1} "
                          f"(NNODES={env.nnodes})")
    port = env.master_port if env.master_port is not None else free_port()
    return [sys.executable, "-m", "torch.distributed.run",
            "--nnodes", str(env.nnodes), "--node_rank", str(env.node_rank),
            "--nproc_per_node", str(nproc),
            "--master_addr", env.master_addr or "127.0.0.1", "--master_port", str(port),
            "-m", "tunesmith", *argv]


def free_port() -> int:
    """A TCP port that is free on this machine right now (single-node runs only)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def relaunch(env: LaunchEnv, nproc: int, argv: list[str]) -> int:
    """Run `tunesmith <argv>` under torchrun and return its exit code."""
    cmd = torchrun_command(env, nproc, argv)
    where = f"node {env.node_rank} of {env.nnodes}, " if env.nnodes > 1 else ""
    print(f"tunesmith: starting {nproc} process(es) ({where}torchrun)", file=sys.stderr,
          flush=True)
    rc = subprocess.call(cmd)
    if rc != 0:
        print(f"tunesmith: distributed run failed (exit code {rc}); the failing rank and its "
              "error are in torchrun's report above", file=sys.stderr, flush=True)
    return rc


def run_recorded(fn: Callable[[], T]) -> T:
    """Run `fn` so that an exception escaping it is written to torchrun's error file
    (TORCHELASTIC_ERROR_FILE) and shown in the agent's report with the rank."""
    from torch.distributed.elastic.multiprocessing.errors import record

    return record(fn)()


def gpu_count() -> int:
    """CUDA GPUs visible to this process (CUDA_VISIBLE_DEVICES applies)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0
