"""What launchers hand to each process besides RANK / WORLD_SIZE: deepspeed's --local_rank
and accelerate's FSDP settings (from `accelerate launch --config_file fsdp_config.yaml`,
as in LLaMA-Factory's examples/accelerate), turned into tunesmith's own keys."""

from __future__ import annotations

import logging

from tunesmith.config.environment import accelerate_fsdp_env, distributed_env
from tunesmith.config.schema import Config
from tunesmith.errors import ConfigError

log = logging.getLogger(__name__)

# accelerate writes the strategy as a number (FSDP 1 enum) or its name
SHARDING = {"1": "full_shard", "FULL_SHARD": "full_shard", "2": "shard_grad_op",
            "SHARD_GRAD_OP": "shard_grad_op", "4": "hybrid_shard",
            "HYBRID_SHARD": "hybrid_shard", "3": "no_shard", "NO_SHARD": "no_shard"}


def apply_launcher_env(cfg: Config) -> None:
    """Check --local_rank against LOCAL_RANK; map accelerate's FSDP settings onto fsdp:
    (a YAML that sets fsdp itself wins, and a different choice is an error)."""
    env = distributed_env()
    if cfg.run.local_rank >= 0 and cfg.run.local_rank != env["local_rank"]:
        raise ConfigError(f"local_rank: {cfg.run.local_rank} differs from LOCAL_RANK="
                          f"{env['local_rank']} set by the launcher; remove the key")
    fsdp = accelerate_fsdp_env()
    if fsdp is None:
        return
    strategy = fsdp.get("FSDP_SHARDING_STRATEGY", "FULL_SHARD").upper()
    if strategy not in SHARDING or SHARDING[strategy] == "no_shard":
        raise ConfigError(f"accelerate config: FSDP sharding strategy {strategy!r} is not run by "
                          "tunesmith; use FULL_SHARD, SHARD_GRAD_OP or HYBRID_SHARD")
    wanted = [SHARDING[strategy]]
    if fsdp.get("FSDP_OFFLOAD_PARAMS", "").lower() == "true":
        wanted.append("offload")
    if cfg.training.fsdp and set(cfg.training.fsdp) - {"auto_wrap"} != set(wanted):
        raise ConfigError(f"fsdp: {cfg.training.fsdp} in the YAML differs from the accelerate "
                          f"config's {wanted}; keep one of the two")
    if not cfg.training.fsdp:
        cfg.training.fsdp = wanted
        log.info("fsdp: %s, from the accelerate config (ACCELERATE_USE_FSDP)", wanted)
