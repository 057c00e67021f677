"""Distributed strategies: how the model is wrapped, stepped and gathered for saving.

    strategy     wraps                                gradients        checkpoint tensors
    single       LossModule(model)                    local            plain
    ddp          DDP(LossModule(model))               all-reduce avg   plain (identical ranks)
    fsdp         fully_shard(layers); fully_shard(    reduce-scatter   gathered on rank 0
                 LossModule(model))  (FSDP2)          avg
    deepspeed    deepspeed.initialize(LossModule)     ZeRO-2/3         see dist/deepspeed.py

The loop calls the wrapped `LossModule`, never the model's parts directly, so every
engine's forward hooks run (DDP's reducer, FSDP2's all-gather, ZeRO-3's fetch). Every
engine averages gradients over ranks; the loop scales each rank's loss by world size /
(global target tokens), so the update equals one process with the whole batch.
"""

from __future__ import annotations

import logging
import math
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any, Literal

import torch

from tunesmith.config.schema import TrainingConfig
from tunesmith.distributed.context import DistContext
from tunesmith.errors import ConfigError

StrategyName = Literal["single", "ddp", "fsdp", "deepspeed"]
FSDP_MODES = ("full_shard", "shard_grad_op", "hybrid_shard")
FSDP_FLAGS = ("offload", "auto_wrap")
FSDP_CONFIG_KEYS = ("reshard_after_forward", "reduce_dtype", "cpu_offload")
PREFIX = "model."  # LossModule holds the model under this name
log = logging.getLogger(__name__)


class LossModule(torch.nn.Module):
    """model + objective as one module whose forward returns the batch's loss sum."""

    def __init__(self, model: torch.nn.Module, objective: Any):
        super().__init__()
        self.model = model
        self.objective = objective

    def forward(self, batch: Any) -> torch.Tensor:
        return self.objective.loss_sum(self.model, batch)


@dataclass(frozen=True)
class FsdpSettings:
    reshard_after_forward: bool = True  # full_shard / hybrid_shard (ZeRO-3); False: ZeRO-2
    hybrid: bool = False  # shard within a node, replicate across nodes
    cpu_offload: bool = False
    reduce_dtype: torch.dtype = torch.float32


def strategy_name(cfg: TrainingConfig, ctx: DistContext) -> StrategyName:
    """deepspeed, fsdp, ddp (several ranks) or single, from the config."""
    if cfg.deepspeed and cfg.fsdp:
        raise ConfigError("deepspeed and fsdp are both set; choose one strategy")
    if cfg.deepspeed:
        return "deepspeed"
    if cfg.fsdp:
        fsdp_settings(cfg)  # validate before any work
        if cfg.fp16:
            raise ConfigError("fsdp with fp16: loss scaling would see only each rank's shard of "
                              "the gradients; use bf16: true (or DeepSpeed, which scales fp16 "
                              "losses itself)")
        return "fsdp" if ctx.distributed else "single"
    return "ddp" if ctx.distributed else "single"


def fsdp_settings(cfg: TrainingConfig) -> FsdpSettings:
    """`fsdp` options + `fsdp_config` -> FsdpSettings (ConfigError on unknown values)."""
    unknown = [o for o in cfg.fsdp if o not in FSDP_MODES + FSDP_FLAGS]
    modes = [o for o in cfg.fsdp if o in FSDP_MODES]
    if unknown or len(modes) > 1:
        raise ConfigError(f"fsdp: {cfg.fsdp!r} must hold one of {', '.join(FSDP_MODES)} "
                          f"(default full_shard) plus optionally {', '.join(FSDP_FLAGS)}"
                          + (f"; unknown: {', '.join(unknown)}" if unknown else ""))
    extra = [k for k in cfg.fsdp_config if k not in FSDP_CONFIG_KEYS]
    if extra:
        raise ConfigError(f"fsdp_config: unknown key(s) {', '.join(extra)}; supported: "
                          f"{', '.join(FSDP_CONFIG_KEYS)}")
    mode = modes[0] if modes else "full_shard"
    reduce_name = str(cfg.fsdp_config.get("reduce_dtype", "float32"))
    reduce = {"float32": torch.float32, "bfloat16": torch.bfloat16}.get(reduce_name)
    if reduce is None:
        raise ConfigError(f"fsdp_config.reduce_dtype: {reduce_name!r} is not float32 or "
                          "bfloat16")
    reshard = cfg.fsdp_config.get("reshard_after_forward", mode != "shard_grad_op")
    return FsdpSettings(bool(reshard), mode == "hybrid_shard",
                        "offload" in cfg.fsdp or bool(cfg.fsdp_config.get("cpu_offload")),
                        reduce)


class Strategy:
    """Single process, DDP and FSDP2 (torch.distributed). DeepSpeed overrides the hooks."""

    def __init__(self, name: StrategyName, ctx: DistContext, cfg: TrainingConfig,
                 find_unused_parameters: bool = False):
        self.name, self.ctx, self.cfg = name, ctx, cfg
        self.find_unused_parameters = find_unused_parameters  # DDP: ddp_find_unused_parameters
        self.model: torch.nn.Module | None = None
        self.inner: LossModule | None = None  # unwrapped LossModule (FSDP: the root)
        self.loss_module: torch.nn.Module | None = None  # what the loop calls

    # ----- set-up ----------------------------------------------------------------------
    def wrap(self, model: torch.nn.Module, objective: Any) -> None:
        """Wrap before the optimizer is built (FSDP2 replaces parameters by shards)."""
        self.model, self.inner = model, LossModule(model, objective)
        self.loss_module = self.inner
        if self.name == "fsdp":
            apply_fsdp2(self.inner, fsdp_settings(self.cfg), self.ctx, self.cfg)
        elif self.name == "ddp":
            from torch.nn.parallel import DistributedDataParallel

            ids = [self.ctx.device.index] if self.ctx.device.type == "cuda" else None
            # buffers (rotary tables) are computed identically on every rank: no broadcast
            self.loss_module = DistributedDataParallel(self.inner, device_ids=ids,
                                                       broadcast_buffers=False,
                                                       gradient_as_bucket_view=True,
                                                       find_unused_parameters=(
                                                           self.find_unused_parameters))

    def attach_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Engines that own the optimizer (DeepSpeed) take it here."""

    # ----- one optimizer step ------------------------------------------------------------
    def micro_context(self, last: bool) -> AbstractContextManager:
        """Around forward + backward of a micro-batch: DDP syncs gradients on the last only.
        (FSDP2 reduce-scatters every micro-batch, keeping only sharded gradients.)"""
        if self.name == "ddp" and not last:
            return self.loss_module.no_sync()  # type: ignore[union-attr]
        return nullcontext()

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def clip(self, max_norm: float) -> torch.Tensor:
        """Clip the trainable gradients to `max_norm` (0: no clipping); the total norm, on the
        device (no host sync)."""
        params = [p for p in self.model.parameters() if p.requires_grad]  # type: ignore[union-attr]
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm > 0 else math.inf)
        if hasattr(norm, "full_tensor"):  # FSDP2: a replicated DTensor
            norm = norm.full_tensor()
        return norm

    def finish_step(self, optimizer: torch.optim.Optimizer, scaler: Any, max_norm: float,
                    loss_ok: bool) -> tuple[float, bool]:
        """Clip, step unless the loss or the norm is non-finite; (grad norm, stepped)."""
        if scaler is not None:
            scaler.unscale_(optimizer)
        norm = float(self.clip(max_norm))  # one host sync per optimizer step
        stepped = loss_ok and math.isfinite(norm)
        if stepped:
            if scaler is not None:
                scaler.step(optimizer)
            else:
                optimizer.step()
        if scaler is not None:
            scaler.update()  # lowers the loss scale after an overflow
        optimizer.zero_grad(set_to_none=True)
        return norm, stepped

    # ----- state for checkpoints and the final output (collectives: call on every rank) ----
    def trainable_state(self) -> dict[str, torch.Tensor] | None:
        """Trainable tensors by the model's parameter names, on rank 0 (None elsewhere)."""
        if self.name == "fsdp":
            return self._gathered(ignore_frozen=True)
        if not self.ctx.is_main:
            return None
        return {n: p.detach().contiguous().cpu() for n, p in self.model.named_parameters()  # type: ignore[union-attr]
                if p.requires_grad}

    def full_state(self) -> dict[str, torch.Tensor] | None:
        """The whole model's state dict on rank 0 for save_pretrained; None elsewhere, and
        None on rank 0 too when the live model can save itself (not sharded)."""
        return self._gathered(ignore_frozen=False) if self.name == "fsdp" else None

    def _gathered(self, ignore_frozen: bool) -> dict[str, torch.Tensor] | None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        opts = StateDictOptions(full_state_dict=True, cpu_offload=True,
                                ignore_frozen_params=ignore_frozen)
        sd = get_model_state_dict(self.inner, options=opts)
        if not self.ctx.is_main:
            return None
        return {k.removeprefix(PREFIX): v for k, v in sd.items()}

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict | None:
        """Optimizer state keyed by parameter names (portable across strategies/world sizes)."""
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_optimizer_state_dict,
        )

        full = self.name == "fsdp"
        sd = get_optimizer_state_dict(self.inner, optimizer, options=StateDictOptions(
            full_state_dict=full, cpu_offload=True))
        return sd if self.ctx.is_main else None

    def load_trainable(self, weights: dict[str, torch.Tensor]) -> None:
        if self.name == "fsdp":
            from torch.distributed.checkpoint.state_dict import (
                StateDictOptions,
                set_model_state_dict,
            )

            set_model_state_dict(self.inner, {PREFIX + k: v for k, v in weights.items()},
                                 options=StateDictOptions(full_state_dict=True, strict=False))
            return
        params = dict(self.model.named_parameters())  # type: ignore[union-attr]
        with torch.no_grad():
            for name, tensor in weights.items():
                params[name].copy_(tensor)

    def load_optimizer(self, optimizer: torch.optim.Optimizer, state: dict) -> None:
        if state.get("deepspeed"):
            log.warning("the checkpoint's optimizer state is in DeepSpeed's own format; "
                        "resuming with its weights and a fresh optimizer state")
            return
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_optimizer_state_dict,
        )

        set_optimizer_state_dict(self.inner, optimizer, state, options=StateDictOptions(
            full_state_dict=self.name == "fsdp"))

    def export_state(self, adapter: bool) -> dict[str, torch.Tensor] | None:
        """Tensors for the final save_pretrained (collective when sharded): the trainable
        ones for an adapter, the whole model otherwise; None when the model saves itself."""
        if self.name != "fsdp":
            return None
        return self.trainable_state() if adapter else self.full_state()

    def load_engine_state(self, path: Any) -> None:
        """Engine-private state of a checkpoint (DeepSpeed's sharded optimizer)."""

    def save_engine_state(self, folder: Any) -> None:
        """Write engine-private state into a checkpoint being written (all ranks)."""


def build_strategy(cfg: TrainingConfig, ctx: DistContext,
                   find_unused_parameters: bool = False) -> Strategy:
    """The strategy the config asks for (DeepSpeed is imported only when named)."""
    name = strategy_name(cfg, ctx)
    if name == "deepspeed":
        from tunesmith.distributed.deepspeed import DeepSpeedStrategy

        return DeepSpeedStrategy(ctx, cfg)
    return Strategy(name, ctx, cfg, find_unused_parameters)


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated decoder blocks: FSDP2's sharding unit."""
    from tunesmith.models.loader import split_causal_lm

    trunk, _ = split_causal_lm(model)
    layers = getattr(trunk, "layers", None)
    if layers is None:
        raise ConfigError(f"fsdp: {type(trunk).__name__} has no .layers list of decoder blocks "
                          "to shard; use DDP or deepspeed for this model")
    return list(layers)


def apply_fsdp2(root: LossModule, s: FsdpSettings, ctx: DistContext,
                cfg: TrainingConfig) -> None:
    """fully_shard every decoder layer, then the root (embeddings, final norm, head)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    dev = ctx.device.type
    if s.cpu_offload and dev != "cuda":
        raise ConfigError("fsdp: offload moves sharded state between GPU and CPU memory; this run "
                          "is on the CPU already, so remove offload (or fsdp_config.cpu_offload)")
    if s.hybrid and ctx.nnodes > 1:
        mesh = init_device_mesh(dev, (ctx.nnodes, ctx.local_world_size),
                                mesh_dim_names=("replicate", "shard"))
    else:
        mesh = init_device_mesh(dev, (ctx.world_size,))
    half = (torch.bfloat16 if cfg.bf16 else torch.float16 if cfg.fp16 else None)
    mp = MixedPrecisionPolicy(param_dtype=half if dev == "cuda" else None,
                              reduce_dtype=s.reduce_dtype)
    kw: dict[str, Any] = {"mesh": mesh, "mp_policy": mp}
    if s.cpu_offload:
        kw["offload_policy"] = CPUOffloadPolicy()
    for layer in decoder_layers(root.model):
        fully_shard(layer, reshard_after_forward=s.reshard_after_forward, **kw)
    fully_shard(root, **kw)
