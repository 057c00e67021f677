"""The config schema: one dataclass per section, every field documented.

Keys are flat in YAML (as in LLaMA-Factory) and unique across sections. Field metadata
(help text, choices, group, bounds) is the single source for validation, `--help` and
the web UI, so none of them can drift from the YAML keys.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal, get_args, get_origin, get_type_hints

from tunesmith.config.export_quant_keys import ExportQuantConfig
from tunesmith.config.fields import opt
from tunesmith.config.infer_keys import InferConfig
from tunesmith.config.method_keys import MethodConfig
from tunesmith.config.optim_keys import OptimConfig
from tunesmith.config.run_keys import RunConfig
from tunesmith.config.speed import SpeedConfig
from tunesmith.config.template_section import TemplateConfig
from tunesmith.config.vocab_keys import VocabConfig

FinetuningType = Literal["lora", "oft", "freeze", "full"]
Stage = Literal["sft", "pt", "dpo", "kto", "rm", "ppo"]
Scheduler = Literal["linear", "cosine", "constant", "constant_with_warmup"]
ReportTo = Literal["none", "tensorboard", "wandb"]
TruncationPolicy = Literal["truncate_prompt", "drop", "error"]
BadRowPolicy = Literal["error", "skip"]
CheckpointingMode = Literal["false", "true", "selective", "offload"]
CompileMode = Literal["auto", "true", "false"]
ExportFormat = Literal["hf", "gguf"]
GGUFType = Literal["f16", "bf16", "q8_0"]
ExportDevice = Literal["cpu", "auto"]
EvalLang = Literal["en", "zh"]
MixStrategy = Literal["concat", "interleave_under", "interleave_over"]


@dataclass
class ModelConfig:
    model_name_or_path: str = opt(
        "", "Base model: a built-in alias (smollm2-135m-instruct), a local Hugging Face model "
        "folder, a .gguf file, or a hub id when a network is available.")
    adapter_name_or_path: list[str] = opt(
        [], "PEFT adapter folder(s) to load on top of the base model (comma-separated).")
    template: str = opt(
        "", "Chat template: empty uses the tokenizer's own; or a LLaMA-Factory template name "
        "(qwen3, llama3, chatml, mistral, gemma, deepseek3, glm4, ...: all 124), encoded "
        "token for token as LLaMA-Factory encodes it.")
    trust_remote_code: bool = opt(
        False, "Allow model code from the model folder or hub to run. Off unless you trust it.")
    cache_dir: str = opt("", "Where converted models and downloads are cached "
                         "(default ~/.cache/tunesmith, or $TUNESMITH_CACHE).", advanced=True)
    attn_implementation: str = opt(
        "auto", "Attention kernel: auto (varlen FlashAttention for packed batches on a CUDA GPU, "
        "sdpa otherwise), sdpa, eager, varlen (padding-free FlashAttention for packed batches; "
        "a reference twin on CPU), or a name registered with transformers.", advanced=True)
    enable_liger_kernel: bool = opt(
        False, "Swap RMSNorm and SwiGLU for liger-kernel's fused kernels (needs the liger-kernel "
        "package; GPU).", advanced=True)
    torch_compile: CompileMode = opt(
        "auto", "Compile each decoder layer with torch.compile (regional compilation: fuses "
        "norms, RoPE, activations). auto: on for CUDA training of architectures known to "
        "compile cleanly; a compile failure falls back to eager with one warning.",
        advanced=True)


@dataclass
class DataConfig:
    dataset: list[str] = opt([], "Training dataset(s): names in dataset_dir/dataset_info.json, "
                                 "built-in names (identity), or file paths; comma-separated.")
    eval_dataset: list[str] = opt([], "Evaluation dataset(s), same forms as dataset.")
    eval_on_each_dataset: bool = opt(
        False, "Also log the loss of each eval_dataset on its own, as eval_<name>_loss "
        "(eval_loss stays the loss over all of them).", advanced=True)
    dataset_dir: str = opt("data", "Folder holding dataset_info.json and the data files.")
    dataset_vars: dict = opt({}, "Values for {{placeholders}} in dataset text, e.g. "
                                 "{name: Tuney, author: Ada}.")
    cutoff_len: int = opt(2048, "Maximum tokens per sample (prompt + response).", minimum=8)
    truncation: TruncationPolicy = opt(
        "truncate_prompt", "What to do with samples longer than cutoff_len: truncate the "
        "prompt first (keeping the response), drop them (counted), or stop with an error.")
    on_bad_row: BadRowPolicy = opt(
        "error", "Malformed rows: stop before training with a report (error) or skip them with "
        "the same report (skip).")
    max_samples: int = opt(0, "Use at most this many samples per dataset (0: all).", minimum=0)
    val_size: float = opt(0.0, "Validation split: a fraction in (0, 1) or a count >= 1.",
                          minimum=0)
    train_on_prompt: bool = opt(False, "Compute the loss on prompt tokens too.")
    mask_history: bool = opt(False, "Train only the last assistant turn of each conversation.")
    preprocessing_num_workers: int = opt(0, "Processes for tokenisation (0: automatic).",
                                         minimum=0, advanced=True)
    dataloader_num_workers: int = opt(
        0, "DataLoader worker processes collating batches (0: in the training process; "
        "collation is a few NumPy copies, so workers help only with very large batches).",
        minimum=0, advanced=True)
    # --- data layer (issue 3) ---
    mix_strategy: MixStrategy = opt(
        "concat", "How several datasets mix: concat, interleave_under (stop at the first "
        "exhausted) or interleave_over (repeat datasets until all are used).")
    interleave_probs: list[str] = opt(
        [], "Sampling probabilities of the datasets when interleaving (comma-separated, sum 1; "
        "empty: round robin).", advanced=True)
    streaming: bool = opt(
        False, "Data larger than memory: rows are always read lazily and tokenised in chunks "
        "into the on-disk cache; true also streams hub datasets.", advanced=True)
    tokenized_path: str = opt(
        "", "Save the tokenised train/val samples here, or load them from here when the folder "
        "already holds them (the data keys are then not re-read).", advanced=True)
    packing: bool = opt(
        False, "Pack several samples into each row of cutoff_len tokens (best-fit decreasing); "
        "each keeps its own positions and attends only to itself.")
    neat_packing: bool = opt(False, "Alias of packing (LLaMA-Factory key): packing is always "
                                    "contamination-free.", advanced=True)
    batch_tokens: int = opt(
        0, "Form micro-batches by token budget: at most this many (padded) tokens per "
        "micro-batch, grouping samples of similar length (0: per_device_train_batch_size "
        "samples).", minimum=0, advanced=True)
    dataloader_pin_memory: bool = opt(True, "Pin host memory of batches (CUDA only).",
                                      advanced=True)
    dataloader_prefetch_factor: int = opt(2, "Batches each DataLoader worker prepares ahead.",
                                          minimum=1, advanced=True)
    dataloader_persistent_workers: bool = opt(
        True, "Keep DataLoader workers alive between epochs.", advanced=True)
    # --- LLaMA-Factory data keys (issue 16) ---
    preprocessing_batch_size: int = opt(
        1000, "Rows per chunk handed to a tokenisation worker (memory holds a few chunks).",
        minimum=1, advanced=True)
    buffer_size: int = opt(
        16384, "LLaMA-Factory's streaming shuffle buffer. tunesmith shuffles the whole "
        "tokenised store every epoch, so any value is accepted and no buffer is needed.",
        minimum=1, advanced=True)


@dataclass
class FinetuningConfig:
    stage: Stage = opt("sft", "Training stage: sft (supervised fine-tuning), pt (plain text), "
                              "dpo (preference pairs), kto (labelled answers), rm (reward "
                              "model), ppo (reinforcement learning from a reward model).")
    finetuning_type: FinetuningType = opt("lora", "lora, freeze (train the last layers) or full.")
    lora_rank: int = opt(8, "LoRA rank r.", minimum=1)
    lora_alpha: float = opt(0, "LoRA alpha (0: twice the rank).", minimum=0)
    lora_dropout: float = opt(0.0, "Dropout on the LoRA input.", minimum=0, maximum=1)
    lora_target: list[str] = opt(["all"], "Modules to adapt: all (every linear layer but the "
                                          "output head) or names such as q_proj,v_proj.")
    use_rslora: bool = opt(False, "Rank-stabilised LoRA scaling (alpha / sqrt(r)).")
    use_dora: bool = opt(False, "Weight-decomposed LoRA (DoRA).")
    freeze_trainable_layers: int = opt(
        2, "freeze: train the last N decoder layers (negative: the first N).")
    freeze_trainable_modules: list[str] = opt(
        ["all"], "freeze: modules inside trainable layers to train (all, or names like mlp).")


@dataclass
class TrainingConfig:
    output_dir: str = opt("", "Where the tuned adapter/model, checkpoints and metrics go.")
    overwrite_output_dir: bool = opt(False, "Allow writing into a non-empty output_dir (and, "
                                            "for export, replacing a non-empty export_dir).")
    per_device_train_batch_size: int = opt(1, "Samples per micro-batch.", minimum=1)
    per_device_eval_batch_size: int = opt(1, "Samples per evaluation batch.", minimum=1)
    gradient_accumulation_steps: int = opt(1, "Micro-batches per optimizer step.", minimum=1)
    auto_batch_size: bool = opt(
        False, "Run each optimizer step in the largest micro-batches that fit: start with the "
        "whole step and halve on out-of-memory, without losing the run or changing results.")
    memory_threshold: float = opt(
        0.9, "auto_batch_size: also halve when the peak passes this share of GPU memory.",
        minimum=0, maximum=1, exclusive_min=True, advanced=True)
    learning_rate: float = opt(5e-5, "Peak learning rate.", minimum=0, exclusive_min=True)
    num_train_epochs: float = opt(3.0, "Epochs (may be fractional).", minimum=0,
                                  exclusive_min=True)
    max_steps: int = opt(0, "Stop after this many optimizer steps (0: use epochs).", minimum=0)
    lr_scheduler_type: Scheduler = opt("cosine", "Learning-rate schedule after warmup.")
    warmup_ratio: float = opt(0.0, "Warmup as a fraction of all steps.", minimum=0, maximum=1)
    warmup_steps: int = opt(0, "Warmup steps (overrides warmup_ratio).", minimum=0)
    weight_decay: float = opt(0.0, "AdamW weight decay.", minimum=0)
    adam_beta1: float = opt(0.9, "AdamW beta1.", minimum=0, maximum=1, advanced=True)
    adam_beta2: float = opt(0.999, "AdamW beta2.", minimum=0, maximum=1, advanced=True)
    adam_epsilon: float = opt(1e-8, "AdamW epsilon.", minimum=0, exclusive_min=True,
                              advanced=True)
    max_grad_norm: float = opt(1.0, "Clip gradients to this norm (0: no clipping).", minimum=0)
    bf16: bool = opt(False, "bf16 mixed precision (GPU; CPU runs stay fp32).")
    fp16: bool = opt(False, "fp16 mixed precision with loss scaling (GPU).")
    gradient_checkpointing: CheckpointingMode = opt(
        "false", "Activation recompute: false, true, selective or offload.")
    logging_steps: int = opt(5, "Log metrics every N optimizer steps.", minimum=1)
    save_steps: int = opt(500, "Write a checkpoint every N optimizer steps (0: never).",
                          minimum=0)
    save_total_limit: int = opt(0, "Keep at most N checkpoints (0: all).", minimum=0)
    eval_steps: int = opt(0, "Evaluate every N steps (0: at the end only, if there is "
                             "validation data).", minimum=0)
    seed: int = opt(42, "Random seed for initialisation, data order and dropout.")
    resume_from_checkpoint: str = opt("", "auto (latest complete checkpoint in output_dir) or "
                                          "a checkpoint path.")
    report_to: ReportTo = opt("none", "Also log to tensorboard or wandb (when installed).")
    max_nonfinite_steps: int = opt(
        5, "Stop after this many consecutive skipped steps with a non-finite loss or gradient.",
        minimum=1, advanced=True)
    loss_chunk_size: int = opt(
        0, "Rows per chunk in the fused linear cross-entropy (0: automatic, about 512 MiB of "
        "fp32 logits per chunk).", minimum=0, advanced=True)
    loss_impl: Literal["chunked", "reference"] = opt(
        "chunked", "Loss: chunked linear cross-entropy or the plain reference path.",
        advanced=True)
    device: str = opt("auto", "auto, cpu, cuda or cuda:N.", advanced=True)
    # Accepted for LLaMA-Factory compatibility; each is honoured, none is ignored silently.
    do_train: bool = opt(True, "Must be true for `tunesmith train` (LLaMA-Factory key).",
                         advanced=True)
    plot_loss: bool = opt(True, "Draw loss.png (always drawn; false turns it off).",
                          advanced=True)
    overwrite_cache: bool = opt(False, "Re-tokenise even when a cached copy exists.",
                                advanced=True)
    save_only_model: bool = opt(False, "Checkpoints hold only the weights (no optimizer "
                                       "state: such checkpoints cannot resume exactly).",
                                advanced=True)
    eval_strategy: Literal["no", "steps", "epoch"] = opt(
        "steps", "When to evaluate on the validation split.", advanced=True)
    ddp_timeout: int = opt(1800, "Seconds a rank waits in a collective before failing.",
                           minimum=1, advanced=True)
    # Distributed training (several processes, launched by torchrun; see docs/distributed.md)
    ddp_backend: Literal["auto", "nccl", "gloo"] = opt(
        "auto", "Collective backend: auto (nccl on GPUs, gloo on CPUs), nccl or gloo.",
        advanced=True)
    fsdp: list[str] = opt(
        [], "Shard with FSDP2 instead of DDP: full_shard, shard_grad_op or hybrid_shard, "
        "optionally with offload (parameters and optimizer state on the CPU); auto_wrap is "
        "accepted (decoder layers are always the wrapping unit).", advanced=True)
    fsdp_config: dict = opt(
        {}, "FSDP2 details: reshard_after_forward (bool), reduce_dtype (float32 or bfloat16), "
        "cpu_offload (bool).", advanced=True)
    deepspeed: str = opt(
        "", "Path to a DeepSpeed JSON config (ZeRO-2/3, offload); needs the deepspeed extra. "
        "Examples in examples/deepspeed/.", advanced=True)


@dataclass
class ExportConfig:
    export_dir: str = opt("", "`tunesmith export`: folder for the merged model (HF) or the GGUF "
                              "file and its Ollama Modelfile.")
    export_format: ExportFormat = opt(
        "hf", "hf: a Hugging Face safetensors folder; gguf: one GGUF file for llama.cpp/Ollama.")
    gguf_type: GGUFType = opt("f16", "GGUF weight type: f16, bf16 or q8_0 (8-bit, about half "
                                     "the size of f16).")
    export_size: float = opt(5.0, "Largest safetensors shard, in GB (HF export).", minimum=0,
                             exclusive_min=True)
    export_device: ExportDevice = opt(
        "cpu", "Where adapters are merged: cpu, or auto (a CUDA GPU when one is visible).")
    export_legacy_format: bool = opt(
        False, "LLaMA-Factory key; must stay false: tunesmith writes safetensors only, never "
        "pickle (.bin) weights.", advanced=True)


@dataclass
class EvalConfig:
    """`tunesmith eval`: loss/perplexity (default), predictions scored with BLEU/ROUGE
    (predict_with_generate), or a multiple-choice benchmark (task). LLaMA-Factory names."""

    task: str = opt("", "Multiple-choice benchmark NAME_SPLIT, e.g. mmlu_test, ceval_validation, "
                        "cmmlu_test: the folder task_dir/NAME in MMLU, C-Eval or CMMLU file "
                        "layout. Empty: loss/perplexity, or predictions (predict_with_generate).")
    task_dir: str = opt("evaluation", "Folder holding the benchmark folders (mmlu, ceval, ...).")
    n_shot: int = opt(5, "Solved dev-split examples shown before each benchmark question.",
                      minimum=0)
    lang: EvalLang = opt("en", "Language of the benchmark instructions: en or zh.")
    save_dir: str = opt("", "Where benchmark results go (results.json); empty: output_dir, or "
                            "only printed when that is empty too.")
    batch_size: int = opt(4, "Benchmark questions per forward pass.", minimum=1)
    do_predict: bool = opt(False, "Same as predict_with_generate (LLaMA-Factory writes both).")
    predict_with_generate: bool = opt(
        False, "eval: generate an answer for every prompt of eval_dataset (or dataset) into "
        "output_dir/generated_predictions.jsonl and score BLEU-4 and ROUGE-1/2/L.")
    # generation keys: eval predictions and stage ppo's rollouts
    max_new_tokens: int = opt(1024, "Predictions, ppo rollouts: most tokens generated per "
                                    "prompt.", minimum=1)
    do_sample: bool = opt(True, "Predictions, ppo rollouts: sample (true) or decode greedily "
                                "(false).")
    temperature: float = opt(0.95, "Predictions, ppo rollouts: sampling temperature.",
                             minimum=0, exclusive_min=True)
    top_p: float = opt(0.7, "Predictions, ppo rollouts: nucleus sampling mass.", minimum=0,
                       maximum=1, exclusive_min=True)
    top_k: int = opt(50, "Predictions, ppo rollouts: sample among the k likeliest tokens "
                         "(0: off).", minimum=0)
    repetition_penalty: float = opt(1.0, "Predictions, ppo rollouts: penalty on repeated "
                                         "tokens (1: off).", minimum=0, exclusive_min=True)


# Sections in their own modules that import `opt` from here come after it.
from tunesmith.config.multimodal import MultimodalConfig  # noqa: E402
from tunesmith.config.ppo_keys import PpoConfig  # noqa: E402
from tunesmith.config.preference import PreferenceConfig  # noqa: E402
from tunesmith.config.ray_keys import RayConfig  # noqa: E402


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    finetuning: FinetuningConfig = field(default_factory=FinetuningConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    export: ExportConfig = field(default_factory=ExportConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    speed: SpeedConfig = field(default_factory=SpeedConfig)
    multimodal: MultimodalConfig = field(default_factory=MultimodalConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)  # LLaMA-Factory keys (issue 15)
    method: MethodConfig = field(default_factory=MethodConfig)
    run: RunConfig = field(default_factory=RunConfig)
    infer: InferConfig = field(default_factory=InferConfig)
    export_quant: ExportQuantConfig = field(default_factory=ExportQuantConfig)
    vocab: VocabConfig = field(default_factory=VocabConfig)
    template: TemplateConfig = field(default_factory=TemplateConfig)
    preference: PreferenceConfig = field(default_factory=PreferenceConfig)
    ray: RayConfig = field(default_factory=RayConfig)
    ppo: PpoConfig = field(default_factory=PpoConfig)

    def to_flat(self) -> dict[str, Any]:
        """Flat key -> value mapping, as written to config.resolved.yaml."""
        flat: dict[str, Any] = {}
        for section in SECTIONS:
            flat.update(dataclasses.asdict(getattr(self, section)))
        return flat


SECTIONS = ("model", "data", "finetuning", "training", "export", "eval", "speed",
            "multimodal", "optim", "method", "run", "infer", "export_quant", "vocab",
            "template", "preference", "ray", "ppo")


def field_index() -> dict[str, tuple[str, dataclasses.Field]]:
    """Every flat key -> (section name, dataclass field)."""
    index: dict[str, tuple[str, dataclasses.Field]] = {}
    for section in SECTIONS:
        section_type = Config.__dataclass_fields__[section].default_factory
        hints = get_type_hints(section_type)  # a section may live in another module
        for f in dataclasses.fields(section_type):
            f.type = hints[f.name]
            assert f.name not in index, f"duplicate config key {f.name}"
            index[f.name] = (section, f)
    return index


def field_choices(f: dataclasses.Field) -> tuple[str, ...] | None:
    """The closed set of values of a field, from its Literal type or its metadata."""
    if f.metadata.get("choices"):
        return f.metadata["choices"]
    tp = _resolve(f.type)
    if get_origin(tp) is Literal:
        return tuple(get_args(tp))
    return None


def _resolve(tp: Any) -> Any:
    if isinstance(tp, str):
        return eval(tp, globals())  # annotations are strings under `from __future__`
    return tp


def field_kind(f: dataclasses.Field) -> str:
    """One of: bool, int, float, str, list, dict (Literal fields are str)."""
    tp = _resolve(f.type)
    if get_origin(tp) is Literal:
        return "str"
    if get_origin(tp) is list or tp is list:
        return "list"
    return {bool: "bool", int: "int", float: "float", str: "str", dict: "dict"}[tp]
