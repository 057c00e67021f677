"""Objectives of the preference stages, plugged into the one loop like SFT's.

Each returns the *sum* of per-item losses over the micro-batch; the batch's `loss_units`
(items) make the loop divide by the items of the whole optimizer step, so gradient
accumulation and several ranks equal one large batch, as for token losses.

    one forward over [chosen | rejected] (or packed items) -> completion log-probs [S]
    reference: precomputed values in the batch | reference forward under no_grad
    -> pair losses (preference.py) | KTO losses (kto.py) | pairwise RM loss (reward.py)
"""

from __future__ import annotations

import torch

from tunesmith.data.preference_batch import PreferenceBatch
from tunesmith.train.objectives.completion import completion_logps, trunk_hidden
from tunesmith.train.objectives.kto import KtoSettings, kto_kl, kto_losses
from tunesmith.train.objectives.preference import PairLossSettings, pair_losses
from tunesmith.train.objectives.reference import Reference
from tunesmith.train.objectives.reward import VALUE_HEAD_ATTR, pairwise_losses
from tunesmith.train.objectives.stats import MetricSums


class _Base:
    def __init__(self, loss_impl: str = "chunked", chunk_size: int = 0):
        self.loss_impl, self.chunk_size = loss_impl, chunk_size
        self.stats = MetricSums()

    def logps(self, model: torch.nn.Module, batch: PreferenceBatch) -> torch.Tensor:
        return completion_logps(model, batch, self.loss_impl, self.chunk_size)

    def drain_metrics(self, split: str) -> dict[str, tuple[float, int]]:
        return self.stats.drain(split)

    def _log(self, model: torch.nn.Module, batch: PreferenceBatch,
             **values: torch.Tensor) -> None:
        split = "train" if model.training else "eval"
        for name, v in values.items():
            self.stats.add(split, name, v, live=batch.live)


class DpoObjective(_Base):
    """DPO and its variants on pairs; the reference forward is skipped for orpo/simpo and
    when the batch carries precomputed reference log-probs."""

    def __init__(self, settings: PairLossSettings, reference: Reference | None, **kw):
        super().__init__(**kw)
        self.settings, self.reference = settings, reference

    def reference_logps(self, model: torch.nn.Module, batch: PreferenceBatch
                        ) -> torch.Tensor | None:
        if not self.settings.uses_reference or batch.ref_chosen is not None:
            return None
        assert self.reference is not None, "a reference is needed for this loss"
        return self.reference.logps(model, batch, self.logps)

    def loss_sum(self, model: torch.nn.Module, batch: PreferenceBatch) -> torch.Tensor:
        s = self.settings
        sums = self.logps(model, batch)  # [S]
        n = batch.seq_tokens.clamp(min=1)
        policy = sums / n if s.uses_average else sums
        pc, pr = policy[batch.chosen_pos], policy[batch.rejected_pos]
        rc = rr = None
        if s.uses_reference:
            if batch.ref_chosen is not None:  # precomputed sums
                rc, rr = batch.ref_chosen, batch.ref_rejected
                if s.uses_average:
                    rc, rr = rc / n[batch.chosen_pos], rr / n[batch.rejected_pos]
            else:
                ref = self.reference_logps(model, batch)
                ref = ref / n if s.uses_average else ref
                rc, rr = ref[batch.chosen_pos], ref[batch.rejected_pos]
        chosen_avg = (sums / n)[batch.chosen_pos]
        losses, rew_c, rew_r = pair_losses(pc, pr, rc, rr, chosen_avg, s)
        self._log(model, batch, **{"rewards/chosen": rew_c, "rewards/rejected": rew_r,
                            "rewards/margins": rew_c - rew_r,
                            "rewards/accuracies": (rew_c > rew_r).float(),
                            "logps/chosen": pc.detach(), "logps/rejected": pr.detach()})
        return losses.sum()


class KtoObjective(_Base):
    def __init__(self, settings: KtoSettings, reference: Reference | None, **kw):
        super().__init__(**kw)
        self.settings, self.reference = settings, reference

    def loss_sum(self, model: torch.nn.Module, batch: PreferenceBatch) -> torch.Tensor:
        sums = self.logps(model, batch)  # [S]
        answer, kl_pos = batch.chosen_pos, batch.kl_pos
        if batch.ref_chosen is not None:
            ref_answer, ref_kl = batch.ref_chosen, batch.ref_kl
        else:
            assert self.reference is not None
            ref = self.reference.logps(model, batch, self.logps)
            ref_answer, ref_kl = ref[answer], ref[kl_pos]
        kl = kto_kl(sums[kl_pos].detach(), ref_kl, live=batch.live)
        avg = (sums / batch.seq_tokens.clamp(min=1))[answer]
        losses, rewards = kto_losses(sums[answer], ref_answer, batch.desirable, kl, avg,
                                     self.settings)
        d = batch.desirable
        self._log(model, batch, **{"kl": kl.reshape(1), "rewards/chosen": rewards[d],
                            "rewards/rejected": rewards[~d]})
        return losses.sum()


class RewardObjective(_Base):
    """Pairwise loss on the value head's score of each completion's last token."""

    def loss_sum(self, model: torch.nn.Module, batch: PreferenceBatch) -> torch.Tensor:
        scores = self.scores(model, batch)  # [S]
        sc, sr = scores[batch.chosen_pos], scores[batch.rejected_pos]
        self._log(model, batch, **{"rewards/chosen": sc.detach(), "rewards/rejected": sr.detach(),
                            "rewards/accuracies": (sc > sr).float()})
        return pairwise_losses(sc, sr).sum()

    @staticmethod
    def scores(model: torch.nn.Module, batch: PreferenceBatch) -> torch.Tensor:
        head = getattr(model, VALUE_HEAD_ATTR)
        return head(trunk_hidden(model, batch).index_select(0, batch.last_index))
