"""When the loop logs and saves, and which samples each epoch takes: the HF Trainer keys
logging_first_step, save_strategy, data_seed and dataloader_drop_last."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from tunesmith.config.run_keys import RunConfig
from tunesmith.config.schema import TrainingConfig
from tunesmith.data.batching import epoch_batches
from tunesmith.errors import ConfigError
from tunesmith.train.cadence import evaluation_due

if TYPE_CHECKING:
    from tunesmith.train.loop import Trainer


def epoch_plan(trainer: Trainer, epoch: int) -> list[list[int]]:
    """Micro-batches of an epoch: a pure function of (data seed, epoch). `data_seed` orders
    the data apart from `seed`; `dataloader_drop_last` drops a short last micro-batch."""
    run, cfg = trainer.run_cfg, trainer.cfg
    seed = run.data_seed if run.data_seed >= 0 else cfg.seed
    tokens = trainer.loader.batch_tokens
    lengths = getattr(trainer.train, "lengths", None)
    plan = epoch_batches(len(trainer.train), trainer.bs, epoch, seed, lengths, tokens)
    if run.disable_shuffling:
        if tokens:
            raise ConfigError("disable_shuffling: batch_tokens orders samples by length; set "
                              "one of the two")
        n = len(trainer.train)
        plan = [list(range(i, min(i + trainer.bs, n))) for i in range(0, n, trainer.bs)]
    if run.group_by_length:
        if tokens:
            raise ConfigError("group_by_length: batch_tokens already groups by length; set "
                              "one of the two")
        plan = length_grouped(plan, (lambda i: len(trainer.train[i])) if lengths is None
                              else (lambda i: int(lengths[i])), trainer.bs)
    if not run.dataloader_drop_last:
        return plan
    if tokens:
        raise ConfigError("dataloader_drop_last: micro-batches formed by batch_tokens have no "
                          "fixed size to fall short of; set one of the two")
    plan = [b for b in plan if len(b) == trainer.bs]
    if not plan:
        raise ConfigError(f"dataloader_drop_last: the {len(trainer.train)} training samples "
                          f"fill no micro-batch of {trainer.bs}; lower "
                          "per_device_train_batch_size or set dataloader_drop_last: false")
    return plan


MEGABATCH = 50  # micro-batches per length-sorted group, as HF's LengthGroupedSampler


def length_grouped(plan: list[list[int]], length_of: Callable[[int], int], batch_size: int
                   ) -> list[list[int]]:
    """Re-cut an epoch's random order into micro-batches of similar length: mega-batches
    of MEGABATCH x batch_size samples, each sorted longest first; the batch holding the
    longest sample goes first (an out-of-memory shows at once)."""
    order = [i for batch in plan for i in batch]
    size = MEGABATCH * batch_size
    batches: list[list[int]] = []
    for start in range(0, len(order), size):
        mega = sorted(order[start:start + size], key=lambda i: -length_of(i))
        batches += [mega[j:j + batch_size] for j in range(0, len(mega), batch_size)]
    longest = max(range(len(batches)), key=lambda b: length_of(batches[b][0]))
    batches[0], batches[longest] = batches[longest], batches[0]
    return batches


def log_due(step: int, cfg: TrainingConfig, run: RunConfig, total: int,
            steps_per_epoch: int = 0) -> bool:
    """logging_strategy: steps (every logging_steps), epoch (at epoch ends), no (the last
    step only); logging_first_step adds step 1."""
    if step == total or (run.logging_first_step and step == 1):
        return True
    if run.logging_strategy == "epoch":
        return bool(steps_per_epoch) and step % steps_per_epoch == 0
    return run.logging_strategy == "steps" and step % cfg.logging_steps == 0


def save_due(trainer: Trainer, start_epoch: int) -> bool:
    """A checkpoint after this step? save_strategy: steps (every save_steps), epoch (when
    the step finished an epoch), no."""
    strategy, s = trainer.run_cfg.save_strategy, trainer.state
    if strategy == "epoch":
        return s.epoch != start_epoch
    if strategy == "steps":
        return bool(trainer.cfg.save_steps) and s.step % trainer.cfg.save_steps == 0
    return False


def values_needed(trainer: Trainer, start_epoch: int) -> bool:
    """Whether a lagged step's loss is read at once: a log, evaluation, checkpoint or stop
    follows, or it is the last step."""
    s = trainer.state
    return (s.step >= trainer.total_steps or trainer.stop.requested
            or save_due(trainer, start_epoch)
            or log_due(s.step, trainer.cfg, trainer.run_cfg, trainer.total_steps,
                       trainer.steps_per_epoch)
            or evaluation_due(trainer.cfg, s.step, epoch_ended=s.epoch != start_epoch))
