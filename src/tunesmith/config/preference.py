"""Keys of the preference stages (dpo, kto, rm), named as in LLaMA-Factory."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tunesmith.config.schema import opt

PrefLoss = Literal["sigmoid", "hinge", "ipo", "orpo", "simpo"]


@dataclass
class PreferenceConfig:
    pref_beta: float = opt(0.1, "dpo/kto: beta, the strength of the pull towards the reference "
                                "model (orpo: weight of the odds-ratio term).", minimum=0,
                           exclusive_min=True)
    pref_loss: PrefLoss = opt(
        "sigmoid", "dpo: sigmoid (DPO), hinge, ipo, orpo (no reference model) or simpo "
        "(no reference model, length-normalised).")
    pref_ftx: float = opt(0.0, "dpo/kto: weight of an added SFT loss on the chosen answers.",
                          minimum=0)
    dpo_label_smoothing: float = opt(
        0.0, "dpo (sigmoid): conservative DPO, the assumed share of flipped labels (0-0.5).",
        minimum=0, maximum=0.5)
    simpo_gamma: float = opt(0.5, "simpo: target reward margin gamma.", minimum=0)
    kto_chosen_weight: float = opt(1.0, "kto: weight of the desirable answers' losses.",
                                   minimum=0)
    kto_rejected_weight: float = opt(1.0, "kto: weight of the undesirable answers' losses.",
                                     minimum=0)
    ref_model: str = opt(
        "", "dpo/kto: a separate reference model (alias, folder or hub id). Empty: LoRA runs "
        "use the base with adapters disabled (no second copy); full/freeze runs load a frozen "
        "copy of model_name_or_path.")
    ref_model_adapters: list[str] = opt(
        [], "dpo/kto: PEFT adapter folder(s) merged into the reference model.")
    precompute_ref_log_probs: bool = opt(
        False, "dpo/kto: compute the reference log-probabilities once before training "
        "(one pass over the data) instead of a reference forward every step.")
