"""Which form keys each training stage reads: the Train tab shows a stage's keys and hides
the others, and a hidden key goes to the job at its default (never a stale value).

    stage  sft | pt | dpo | kto | rm | ppo      (config key `stage`)
      -> visible(key, stage)   keys not in STAGE_KEYS apply to every stage
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tunesmith.config.schema import Config, Stage, field_index
from tunesmith.data.preference import check_stage_data
from tunesmith.data.registry import DatasetEntry, resolve_dataset
from tunesmith.errors import ConfigError, DataError
from tunesmith.webui.form import FieldSpec

STAGES: tuple[str, ...] = Stage.__args__  # type: ignore[attr-defined]

# key -> the stages that read it (the recipes: recipes/preference.py, data/loading.py)
STAGE_KEYS: dict[str, tuple[str, ...]] = {
    "pref_beta": ("dpo", "kto"),
    "pref_loss": ("dpo",),
    "pref_ftx": ("dpo", "kto"),
    "dpo_label_smoothing": ("dpo",),
    "simpo_gamma": ("dpo",),
    "kto_chosen_weight": ("kto",),
    "kto_rejected_weight": ("kto",),
    "ref_model": ("dpo", "kto"),
    "ref_model_adapters": ("dpo", "kto"),
    "precompute_ref_log_probs": ("dpo", "kto"),
    # pt trains every token of plain text: no prompt to mask
    "train_on_prompt": ("sft", "dpo", "kto", "rm", "ppo"),
    "mask_history": ("sft", "dpo", "kto", "rm", "ppo"),
    **{key: ("ppo",) for key in ("reward_model", "reward_model_adapters", "reward_model_type",
                                 "reward_model_quantization_bit", "ppo_buffer_size",
                                 "ppo_epochs", "ppo_score_norm", "ppo_target",
                                 "ppo_whiten_rewards")},
}
# sections whose every key belongs to some stages: folded away when none is shown
STAGE_SECTIONS: tuple[str, ...] = ("preference", "ppo")


def visible(key: str, stage: str) -> bool:
    """Whether the form shows `key` when training `stage`."""
    return stage in STAGE_KEYS.get(key, STAGES)


def section_visible(section: str, stage: str) -> bool:
    keys = [k for k, (s, _) in field_index().items() if s == section]
    return any(visible(k, stage) for k in keys)


def stage_defaults(form: dict[str, Any], specs: dict[str, FieldSpec]) -> dict[str, Any]:
    """The form with every key the chosen stage does not read set back to its default."""
    stage = str(form.get("stage") or "sft")
    return {k: v if visible(k, stage) else specs[k].default for k, v in form.items()}


def stage_problems(cfg: Config, root: Path, lang: str = "en") -> list[str]:
    """What `tunesmith train` would refuse about the stage before its first step, said
    before the job starts: datasets of the wrong kind (pairs for dpo / rm, kto_tag labels
    for kto, plain rows for sft / pt / ppo), preference key clashes and ppo's keys (a reward
    model folder is looked for where the job runs, `root`)."""
    stage = cfg.finetuning.stage
    problems = []
    folder = root / cfg.data.dataset_dir
    for key in ("dataset", "eval_dataset"):
        for name in getattr(cfg.data, key):
            entry = _entry(name, folder, root)
            why = check_stage_data(entry.name, entry.spec, stage) if entry else None
            if why:
                problems.append(f"{key}: {why}")
    if stage in ("dpo", "kto", "rm"):
        from tunesmith.recipes.preference import check_preference_config

        try:
            check_preference_config(cfg)
        except ConfigError as exc:
            problems += exc.problems
    if stage == "ppo":
        from tunesmith.recipes.ppo import check_ppo_config

        try:
            check_ppo_config(cfg, root)
        except ConfigError as exc:
            problems += exc.problems
    return problems


def _entry(name: str, folder: Path, root: Path) -> DatasetEntry | None:
    """The dataset as the job will find it (its working folder is `root`); None when it
    cannot be found here, which the job then reports with what it looked at."""
    for candidate in (str(root / name), name):  # a path inside the folder, or a name
        try:
            return resolve_dataset(candidate, str(folder))
        except DataError:
            continue
    return None
