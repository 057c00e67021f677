"""The run section: LLaMA-Factory / HF Trainer keys about logging, saving, evaluation,
data order and the model and tokenizer loading, each honoured as LLaMA-Factory does."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tunesmith.config.fields import opt

RopeKind = Literal["", "linear", "dynamic", "yarn", "llama3"]


@dataclass
class RunConfig:
    save_strategy: Literal["no", "steps", "epoch"] = opt(
        "steps", "When to write checkpoints: every save_steps (steps), at each epoch's end "
        "(epoch), or never (no).", advanced=True)
    do_eval: bool = opt(False, "Evaluate on the validation data (required to be present); "
                               "tunesmith evaluates whenever there is validation data.",
                        advanced=True)
    metric_for_best_model: str = opt("eval_loss", "Metric that ranks evaluations: eval_loss "
                                                  "(or loss).", advanced=True)
    greater_is_better: bool = opt(False, "Whether a larger metric_for_best_model is better.",
                                  advanced=True)
    load_best_model_at_end: bool = opt(
        False, "After training, restore the weights of the best evaluation (kept in CPU "
        "memory); the saved model is then that one.", advanced=True)
    early_stopping_steps: int = opt(
        0, "Stop after this many evaluations without improvement of metric_for_best_model "
        "(0: never).", minimum=0, advanced=True)
    logging_strategy: Literal["steps", "epoch", "no"] = opt(
        "steps", "When to log metrics: every logging_steps (steps), at each epoch's end "
        "(epoch), or only the last step (no).", advanced=True)
    log_level: Literal["passive", "debug", "info", "warning", "error", "critical"] = opt(
        "passive", "tunesmith's log level on the main process (passive: the default, info).",
        advanced=True)
    logging_first_step: bool = opt(False, "Also log the first optimizer step.",
                                   advanced=True)
    logging_dir: str = opt("", "Folder for tensorboard event files (default: output_dir).",
                           advanced=True)
    run_name: str = opt("", "Name of the run (wandb run name; recorded in run_summary.json).",
                        advanced=True)
    disable_tqdm: bool = opt(False, "Hide the progress bar.", advanced=True)
    data_seed: int = opt(-1, "Seed of the data order only (-1: seed).", minimum=-1,
                         advanced=True)
    disable_shuffling: bool = opt(
        False, "Keep the training samples in dataset order (no shuffling).", advanced=True)
    dataloader_drop_last: bool = opt(
        False, "Drop each epoch's last micro-batch when it holds fewer samples.",
        advanced=True)
    group_by_length: bool = opt(
        False, "Batch samples of similar length (HF's length-grouped order: random "
        "mega-batches of 50 micro-batches, each sorted longest first), so less padding.",
        advanced=True)
    include_num_input_tokens_seen: bool = opt(
        False, "Log num_input_tokens_seen (input tokens so far, padding excluded).",
        advanced=True)
    save_safetensors: bool = opt(
        True, "Must stay true: tunesmith writes safetensors only, never pickle weights.",
        advanced=True)
    neftune_noise_alpha: float = opt(
        0.0, "NEFTune: uniform noise on the input embeddings while training, scaled by "
        "alpha / sqrt(length x hidden) (0: off; the paper uses 5).", minimum=0,
        advanced=True)
    label_smoothing_factor: float = opt(
        0.0, "Label smoothing of the token cross-entropy (as HF: (1 - e) CE + e mean -log p).",
        minimum=0, maximum=1, advanced=True)
    lr_scheduler_kwargs: dict = opt(
        {}, "Schedule options: num_cycles (cosine: half-waves, default 0.5), min_lr_rate "
        "(cosine / linear floor as a share of learning_rate).", advanced=True)
    ddp_find_unused_parameters: bool = opt(
        False, "DDP: look for parameters without gradient in each step (slower; needed only "
        "when some trainable parameters are unused).", advanced=True)
    print_param_status: bool = opt(False, "Log every parameter's name, shape, dtype, device "
                                          "and whether it trains.", advanced=True)
    local_rank: int = opt(
        -1, "Set by launchers (deepspeed passes --local_rank); tunesmith reads LOCAL_RANK and "
        "checks that the two agree.", minimum=-1, advanced=True)
    fsdp_transformer_layer_cls_to_wrap: str = opt(
        "", "FSDP wrapping class; tunesmith always wraps each decoder layer and checks that "
        "this names the model's decoder layer class.", advanced=True)
    # --- model and tokenizer loading ---
    model_revision: str = opt("main", "Hub revision (branch, tag or commit) of a hub model.",
                              advanced=True)
    use_fast_tokenizer: bool = opt(True, "Use the fast (Rust) tokenizer.", advanced=True)
    model_max_length: int = opt(
        0, "Tokenizer's model_max_length; with rope_scaling, the context to reach (0: the "
        "model's own).", minimum=0, advanced=True)
    rope_scaling: RopeKind = opt(
        "", "Extend the context with RoPE scaling: linear, dynamic, yarn or llama3; factor = "
        "ceil(model_max_length / max_position_embeddings). Empty: off.", advanced=True)
    low_cpu_mem_usage: bool = opt(True, "Load weights without a full random init first.",
                                  advanced=True)
