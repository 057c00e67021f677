"""Stage ppo: config -> prompts -> LoRA policy + value head -> reward model -> PPO loop ->
adapter + value_head.safetensors in output_dir (LLaMA-Factory's layout).

    prompts: the dataset's conversations encoded as for sft; a prompt is everything before
             the last answer (its trained tokens)
    policy:  the base + a LoRA adapter (trained), v_head (trained, fp32)
    reference: the same base with adapters disabled (no second copy)
    reward:  lora (the rm adapter beside the policy's) | full | api (train/ppo_reward.py)
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tunesmith.adapters.setup import load_adapters
from tunesmith.config.environment import distributed_env
from tunesmith.config.loader import dump_config
from tunesmith.config.schema import Config
from tunesmith.data.encode import IGNORE_INDEX, EncodedSample
from tunesmith.data.loading import DataContext, prepare_data
from tunesmith.data.slot_renderer import make_renderer
from tunesmith.data.template import load_template_source
from tunesmith.distributed.context import init_distributed
from tunesmith.errors import ConfigError
from tunesmith.models.loader import load_causal_lm, load_tokenizer
from tunesmith.models.provision import resolve_model_path
from tunesmith.recipes.sft import _save_model, build_model, check_output_dir
from tunesmith.runs.folder import (
    LOSS_PLOT_FILE,
    METRICS_FILE,
    SUMMARY_FILE,
    VALUE_HEAD_FILE,
    lock_run_folder,
)
from tunesmith.train.metrics import MetricsLog, plot_loss
from tunesmith.train.objectives.ppo import PpoSettings
from tunesmith.train.objectives.reward import (
    attach_value_head,
    load_value_head,
    save_value_head,
)
from tunesmith.train.ppo_loop import PpoPlan, PpoTrainer
from tunesmith.train.ppo_reward import (
    REWARD_ADAPTER,
    ApiReward,
    HeadReward,
    RewardModel,
    read_value_head,
)
from tunesmith.train.ppo_rollout import Sampling
from tunesmith.train.run_setup import extend_vocab, load_options

log = logging.getLogger(__name__)


def check_ppo_config(cfg: Config, root: Path = Path(".")) -> None:
    """Every problem of a ppo config at once; `root`: where relative paths start."""
    p, f, t = cfg.ppo, cfg.finetuning, cfg.training
    problems = []
    if not p.reward_model:
        problems.append("reward_model: not set; stage ppo needs the reward model (the output "
                        "folder of a `stage: rm` run, or a URL with reward_model_type: api)")
    if f.finetuning_type != "lora":
        problems.append(f"finetuning_type: {f.finetuning_type!r} with stage ppo is not "
                        "supported yet; use lora (the reference is the base with the adapter "
                        "disabled)")
    if p.reward_model_quantization_bit:
        problems.append(f"reward_model_quantization_bit: {p.reward_model_quantization_bit} is "
                        "not supported yet; remove it (the reward model loads unquantised)")
    rm_folder = root / p.reward_model
    if (p.reward_model and p.reward_model_type == "lora"
            and not (rm_folder / VALUE_HEAD_FILE).is_file()):
        problems.append(f"reward_model: {p.reward_model!r} has no {VALUE_HEAD_FILE}; with "
                        "reward_model_type: lora it is the output folder of a `stage: rm` "
                        "LoRA run (adapter + value head)")
    if p.reward_model_adapters and p.reward_model_type != "full":
        problems.append("reward_model_adapters: set, but reward_model_type is "
                        f"{p.reward_model_type!r}; they apply to reward_model_type: full")
    if t.resume_from_checkpoint:
        problems.append("resume_from_checkpoint: PPO runs cannot be resumed yet (as in "
                        "LLaMA-Factory); remove it")
    if cfg.data.val_size or cfg.data.eval_dataset:
        problems.append("val_size / eval_dataset: stage ppo has no evaluation (as in "
                        "LLaMA-Factory); remove them")
    if cfg.data.packing:
        problems.append("packing: stage ppo generates from single prompts; set packing: false")
    if problems:
        raise ConfigError(problems)


def prompt_ids(sample: EncodedSample) -> list[int]:
    """The tokens before the last answer: the start of the last run of trained tokens."""
    trained = np.flatnonzero(np.asarray(sample.labels) != IGNORE_INDEX)
    if len(trained) == 0:
        return [int(x) for x in sample.input_ids]
    gaps = np.flatnonzero(np.diff(trained) > 1)
    start = int(trained[gaps[-1] + 1]) if len(gaps) else int(trained[0])
    return [int(x) for x in sample.input_ids[:start]]


def stop_token_ids(tokenizer: Any, model: torch.nn.Module) -> frozenset[int]:
    ids = {tokenizer.eos_token_id}
    gen = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids.update(gen if isinstance(gen, list) else [gen])
    return frozenset(int(i) for i in ids if i is not None)


def load_saved_value_head(head: torch.nn.Module, folder: Path) -> None:
    """Continue from a saved value head (a previous ppo output named in
    adapter_name_or_path, or beside the model), as LLaMA-Factory does; else keep the new one."""
    if not (folder / VALUE_HEAD_FILE).is_file():
        return
    saved = load_value_head(folder, head.summary.in_features)
    head.load_state_dict(saved.state_dict())
    log.info("stage ppo: value head loaded from %s", folder / VALUE_HEAD_FILE)


def build_reward(cfg: Config, model: torch.nn.Module, tokenizer: Any,
                 device: torch.device) -> RewardModel:
    p, m = cfg.ppo, cfg.model
    pad = tokenizer.pad_token_id
    if p.reward_model_type == "api":
        if not p.reward_model.startswith(("http://", "https://")):
            raise ConfigError(f"reward_model: {p.reward_model!r} is not an http(s) URL; "
                              "reward_model_type: api POSTs to a URL")
        return ApiReward(p.reward_model,
                         partial(tokenizer.decode, skip_special_tokens=False))
    hidden = model.config.hidden_size
    if p.reward_model_type == "lora":
        folder = Path(p.reward_model)
        head = read_value_head(folder, hidden, "reward_model")
        model.load_adapter(str(folder), adapter_name=REWARD_ADAPTER, is_trainable=False)
        return HeadReward(model, head, pad, adapter=REWARD_ADAPTER)
    path = resolve_model_path(p.reward_model, m.cache_dir or None)
    dtype = torch.bfloat16 if device.type == "cuda" and cfg.training.bf16 else torch.float32
    rm = load_causal_lm(path, dtype=dtype, trust_remote_code=m.trust_remote_code,
                        attn_implementation="sdpa", device=device)
    if p.reward_model_adapters:
        rm = load_adapters(rm, p.reward_model_adapters, trainable=False)
    rm.eval().requires_grad_(False)
    source = Path(p.reward_model_adapters[-1] if p.reward_model_adapters else path)
    return HeadReward(rm, read_value_head(source, rm.config.hidden_size, "reward_model"), pad)


def ppo_plan(cfg: Config, tokenizer: Any, model: torch.nn.Module) -> PpoPlan:
    """The PPO keys, and generation from the eval section's keys (as LLaMA-Factory)."""
    p, e = cfg.ppo, cfg.eval
    sampling = Sampling(e.max_new_tokens, e.do_sample, e.temperature, e.top_p, e.top_k,
                        e.repetition_penalty)
    return PpoPlan(p.ppo_buffer_size, p.ppo_epochs, p.ppo_score_norm, p.ppo_target,
                   PpoSettings(whiten_rewards=p.ppo_whiten_rewards), sampling,
                   stop_token_ids(tokenizer, model), tokenizer.pad_token_id)


def run_ppo(cfg: Config) -> dict[str, Any]:
    """Train stage ppo under output_dir's lock (one process)."""
    if distributed_env()["world_size"] > 1:
        raise ConfigError("stage ppo runs in one process for now; launch it without torchrun "
                          "(several ranks are not supported yet)")
    check_ppo_config(cfg)
    if not cfg.model.model_name_or_path:
        raise ConfigError("model_name_or_path: not set; e.g. smollm2-135m-instruct")
    if not cfg.training.output_dir:
        check_output_dir(cfg)  # the error naming output_dir
    lock = lock_run_folder(Path(cfg.training.output_dir), "tunesmith train")
    try:
        return _run_ppo(cfg)
    finally:
        lock.release()


def _load_prompts(cfg: Config, tokenizer: Any, out: Path) -> tuple[list[list[int]], Any]:
    m, t = cfg.model, cfg.training
    template_name, template_source = load_template_source(m.template, tokenizer)
    renderer = make_renderer(template_name, template_source, tokenizer, cfg.template)
    data = prepare_data(cfg.data, DataContext(renderer, tokenizer, t.seed, "ppo",
                                              t.overwrite_cache, None, m.model_name_or_path))
    every = [prompt_ids(s) for s in data.train]
    prompts = [q for q in every if q]
    if len(prompts) < len(every):  # an answer with no prompt before it: nothing to ask
        log.warning("stage ppo: %d of %d samples have no prompt before their answer and are "
                    "left out", len(every) - len(prompts), len(every))
    if not prompts:
        raise ConfigError(f"dataset: {cfg.data.dataset} gave no prompts for stage ppo (every "
                          "sample starts with its answer); use a dataset with instructions")
    return prompts, (template_source, data.report)


def _run_ppo(cfg: Config) -> dict[str, Any]:
    m, t = cfg.model, cfg.training
    started = time.perf_counter()
    ctx = init_distributed(t.device, t.ddp_backend, t.ddp_timeout)
    out = check_output_dir(cfg)
    model_path = resolve_model_path(m.model_name_or_path, m.cache_dir or None)
    tokenizer = load_tokenizer(model_path, trust_remote_code=m.trust_remote_code,
                               opts=load_options(cfg))
    described = extend_vocab(tokenizer, cfg)
    prompts, (template_source, report) = _load_prompts(cfg, tokenizer, out)
    dump_config(cfg, out / "config.resolved.yaml")
    model, _ = build_model(cfg, model_path, ctx.device, vocab=(tokenizer, described))
    head = attach_value_head(model, model.config.hidden_size, t.seed)
    load_saved_value_head(head, Path((m.adapter_name_or_path or [model_path])[-1]))
    reward = build_reward(cfg, model, tokenizer, ctx.device)
    save = partial(_save_policy, model=model, tokenizer=tokenizer,
                   template_source=template_source, cfg=cfg,
                   save_extra=lambda folder: save_value_head(head, Path(folder)))
    metrics = MetricsLog(out / METRICS_FILE, t.report_to, out, cfg.run.logging_dir,
                         cfg.run.run_name)
    trainer = PpoTrainer(model, head, reward, prompts, t, ppo_plan(cfg, tokenizer, model),
                         device=ctx.device, metrics=metrics, optim=cfg.optim,
                         disable_tqdm=cfg.run.disable_tqdm, save_checkpoint=save,
                         output_dir=out)
    try:
        result = trainer.run()
    finally:
        metrics.close()
        if t.plot_loss:
            plot_loss(out / METRICS_FILE, out / LOSS_PLOT_FILE)
    save(out)
    summary = {"run_name": cfg.run.run_name or out.name, "stage": "ppo", **result,
               "prompts": len(prompts), "data": report.summary(),
               "wall_s": round(time.perf_counter() - started, 3)}
    (out / SUMMARY_FILE).write_text(json.dumps(summary, indent=2, default=float))
    print(f"ppo: {result['steps']} steps, last reward {result['last'].get('reward')}; "
          f"saved to {out}")
    return summary


def _save_policy(folder: Path, **kw: Any) -> None:
    """The policy's adapter, tokenizer and value head; PEFT writes every loaded adapter, so
    the reward adapter's copy (a subfolder named after it) is removed: it is an input."""
    _save_model(folder, **kw)
    shutil.rmtree(folder / REWARD_ADAPTER, ignore_errors=True)
