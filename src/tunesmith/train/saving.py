"""Writing a trainer's checkpoint and resuming from one (the loop's checkpoint seam).

    Every rank calls both; rank 0 writes. A checkpoint is gathered to rank 0 in a format that
    does not depend on the strategy or the number of ranks (train/checkpoint.py).
"""

from __future__ import annotations

import logging
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from tunesmith.distributed.context import barrier, broadcast_object, gather_objects
from tunesmith.errors import TrainingError
from tunesmith.runs.folder import checkpoint_tmp
from tunesmith.train.checkpoint import (
        CheckpointState,
        begin_checkpoint,
        capture_rng,
        check_weights,
        finish_checkpoint,
        pick_checkpoint,
        read_checkpoint,
        restore_rng,
        rotate_checkpoints,
    )

if TYPE_CHECKING:
    from tunesmith.train.loop import Trainer

log = logging.getLogger(__name__)


def save_trainer(trainer: Trainer) -> Path:
    """Write checkpoint-<step> of `trainer` (weights, optimizer, scheduler, scaler, RNG of
    every rank, loop state) atomically; returns its path."""
    s, ctx = trainer.state, trainer.ctx
    weights = trainer.strategy.trainable_state()
    optim = None if trainer.cfg.save_only_model else trainer.strategy.optimizer_state(
        trainer.optimizer)
    rngs = gather_objects(capture_rng(), ctx)
    if ctx.is_main:
        begin_checkpoint(trainer.output_dir, s.step)
    barrier(ctx)
    trainer.strategy.save_engine_state(checkpoint_tmp(trainer.output_dir, s.step))
    path = trainer.output_dir / f"checkpoint-{s.step}"
    if ctx.is_main:
        meta = {**asdict(s), "total_steps": trainer.total_steps, "world_size": trainer.world,
                "strategy": trainer.strategy.name}
        sched = trainer.scheduler.state_dict() if optim is not None else None
        scaler = trainer.scaler.state_dict() if trainer.scaler and optim is not None else None
        state = CheckpointState(weights or {}, optim, sched, scaler, list(rngs or []), meta)
        extra = (lambda folder: trainer.checkpoint_extra(folder, state_dict=weights)
                 ) if trainer.checkpoint_extra else None
        path = finish_checkpoint(trainer.output_dir, s.step, state, extra)
        rotate_checkpoints(trainer.output_dir, trainer.cfg.save_total_limit)
    barrier(ctx)  # nobody runs ahead of a checkpoint that is not on disk yet
    return path


def resume_trainer(trainer: Trainer, spec: str) -> None:
    """Restore `trainer` from checkpoint `spec` (a path, or auto: the newest intact one)."""
    verdict: object = None
    if trainer.ctx.is_main:
        try:
            verdict = pick_checkpoint(trainer.output_dir, spec)
        except TrainingError as exc:  # every rank stops with rank 0's reason
            verdict = exc
    path = broadcast_object(verdict, trainer.ctx)  # one decision for every rank
    if isinstance(path, TrainingError):
        raise path
    if path is None:
        log.info("resume_from_checkpoint: auto found no checkpoint; starting fresh")
        return
    ckpt = read_checkpoint(path)
    trainable = [n for n, p in trainer.model.named_parameters() if p.requires_grad]
    check_weights(path, ckpt.weights, trainable)
    trainer.strategy.load_trainable(ckpt.weights)
    if ckpt.optimizer is not None:
        trainer.strategy.load_optimizer(trainer.optimizer, ckpt.optimizer)
        trainer.scheduler.load_state_dict(ckpt.scheduler)
        if trainer.scaler is not None and ckpt.scaler is not None:
            trainer.scaler.load_state_dict(ckpt.scaler)
    trainer.strategy.load_engine_state(path)
    same_world = len(ckpt.rng) == trainer.world
    restore_rng(ckpt.rng[trainer.ctx.rank if same_world else 0])
    fields = set(type(trainer.state).__dataclass_fields__)
    trainer.state = type(trainer.state)(**{k: v for k, v in ckpt.meta.items() if k in fields})
    saved_world = ckpt.meta.get("world_size", 1)
    if saved_world != trainer.world and trainer.ctx.is_main:
        log.warning("%s was written by %d rank(s), resuming on %d: the data plan continues "
                    "where it stopped, but each optimizer step now takes %d micro-batches",
                    path, saved_world, trainer.world, trainer.accum * trainer.world)
    log.info("resumed from %s at step %d", path, trainer.state.step)
    if trainer.ctx.is_main:
        print(f"resumed from {path} (step {trainer.state.step} of {trainer.total_steps})")
