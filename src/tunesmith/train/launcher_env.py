"""What launchers hand to each process besides RANK / WORLD_SIZE: deepspeed's --local_rank
and accelerate's FSDP settings (from `accelerate launch --config_file fsdp_config.yaml`,
as in LLaMA-Factory's examples/accelerate), turned into tunesmith's own keys."""

from __future__ import annotations

import logging

from tunesmith.config.environment import (
    accelerate_fsdp_env,
    accelerate_mixed_precision,
    distributed_env,
)
from tunesmith.config.schema import Config
from tunesmith.errors import ConfigError

log = logging.getLogger(__name__)

# accelerate writes the strategy as a number (FSDP 1 enum) or its name
SHARDING = {"1": "full_shard", "FULL_SHARD": "full_shard", "2": "shard_grad_op",
            "SHARD_GRAD_OP": "shard_grad_op", "4": "hybrid_shard",
            "HYBRID_SHARD": "hybrid_shard", "3": "no_shard", "NO_SHARD": "no_shard"}
# the YAML keys that give each accelerate mixed_precision
FIX = {"bf16": "bf16: true", "fp16": "fp16: true", "fp8": "fp8: true (and bf16: true)",
       "no": "bf16: false and fp16: false"}


def apply_launcher_env(cfg: Config) -> None:
    """Check --local_rank against LOCAL_RANK; map accelerate's FSDP settings onto fsdp:
    (a YAML that sets fsdp itself wins, and a different choice is an error)."""
    env = distributed_env()
    if cfg.run.local_rank >= 0 and cfg.run.local_rank != env["local_rank"]:
        raise ConfigError(f"local_rank: {cfg.run.local_rank} differs from LOCAL_RANK="
                          f"{env['local_rank']} set by the launcher; remove the key")
    warn_precision_mismatch(cfg)
    fsdp = accelerate_fsdp_env()
    if fsdp is None:
        return
    wanted = [_sharding(fsdp)]
    if fsdp.get("FSDP_OFFLOAD_PARAMS", "").lower() == "true":
        wanted.append("offload")
    if cfg.training.fsdp and set(cfg.training.fsdp) - {"auto_wrap"} != set(wanted):
        raise ConfigError(f"fsdp: {cfg.training.fsdp} in the YAML differs from the accelerate "
                          f"config's {wanted}; keep one of the two")
    if not cfg.training.fsdp:
        cfg.training.fsdp = wanted
        log.info("fsdp: %s, from the accelerate config (ACCELERATE_USE_FSDP)", wanted)


def _sharding(fsdp: dict[str, str]) -> str:
    """The fsdp: strategy an accelerate config asks for. FSDP 2 configs (fsdp_version: 2)
    say it with fsdp_reshard_after_forward (true: full_shard, false: shard_grad_op);
    accelerate still exports its FSDP 1 default FULL_SHARD beside it."""
    if fsdp.get("FSDP_VERSION", "1") == "2" and "FSDP_RESHARD_AFTER_FORWARD" in fsdp:
        reshard = fsdp["FSDP_RESHARD_AFTER_FORWARD"].lower() == "true"
        return "full_shard" if reshard else "shard_grad_op"
    strategy = fsdp.get("FSDP_SHARDING_STRATEGY", "FULL_SHARD").upper()
    if strategy not in SHARDING or SHARDING[strategy] == "no_shard":
        raise ConfigError(f"accelerate config: FSDP sharding strategy {strategy!r} is not run by "
                          "tunesmith; use FULL_SHARD, SHARD_GRAD_OP or HYBRID_SHARD")
    return SHARDING[strategy]


def warn_precision_mismatch(cfg: Config) -> bool:
    """tunesmith takes the precision from the YAML (bf16 / fp16); an accelerate config whose
    mixed_precision says otherwise is named in a warning. Returns True when it warned."""
    launcher = accelerate_mixed_precision()
    yaml = "bf16" if cfg.training.bf16 else "fp16" if cfg.training.fp16 else "no"
    if not launcher or launcher == yaml:
        return False
    log.warning("accelerate config: mixed_precision %s (ACCELERATE_MIXED_PRECISION) differs "
                "from the YAML's precision (%s); tunesmith follows the YAML: set %s in it to "
                "change that", launcher, yaml, FIX.get(launcher, "bf16 or fp16"))
    return True
