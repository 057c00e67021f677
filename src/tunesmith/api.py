"""Python API for scripts and notebooks: the CLI's verbs as functions, with the same
validation and outputs.

    import tunesmith
    summary = tunesmith.train("cfg.yaml", max_steps=100)          # or a dict of keys
    tunesmith.export({"model_name_or_path": ..., "adapter_name_or_path": "saves/run",
                      "export_dir": "merged"})
    results = tunesmith.evaluate("cfg.yaml", predict_with_generate=True)
    chat = tunesmith.chat(model_name_or_path="smollm2-135m-instruct")
    print(chat("Who are you?", max_new_tokens=64))

A run started here is one process; several GPUs take `tunesmith train` (or torchrun
around a script calling tunesmith.train).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tunesmith.config.schema import Config
from tunesmith.errors import ConfigError

ConfigSource = str | Path | Mapping[str, Any] | Config | None


def load(config: ConfigSource = None, **overrides: Any) -> Config:
    """A validated Config from a YAML path, a mapping of keys, or a Config, plus keyword
    overrides (a key given both ways takes the keyword's value)."""
    from tunesmith.config.loader import build_config, load_config

    if isinstance(config, Config):
        config = config.to_flat()
    if config is None or isinstance(config, Mapping):
        raw = {k: (v, "python") for k, v in {**(config or {}), **overrides}.items()}
        return build_config(raw)
    if isinstance(config, str | Path):
        return load_config(config, {k: (v, "python") for k, v in overrides.items()})
    raise ConfigError(f"config: expected a YAML path, a dict of keys or a Config, got "
                      f"{type(config).__name__}")


def _setup(cfg: Config) -> None:
    from tunesmith.cli.setup import setup_process

    setup_process(cfg.training.seed)


def train(config: ConfigSource = None, **overrides: Any) -> dict[str, Any]:
    """`tunesmith train` in this process (any stage: sft, pt, dpo, kto, rm); returns the run
    summary (run_summary.json)."""
    cfg = load(config, **overrides)
    _setup(cfg)
    from tunesmith.recipes.stages import run_stage

    return run_stage(cfg)


def export(config: ConfigSource = None, **overrides: Any) -> Path:
    """`tunesmith export`; returns the export folder."""
    cfg = load(config, **overrides)
    _setup(cfg)
    from tunesmith.recipes.export import run_export

    return run_export(cfg)


def evaluate(config: ConfigSource = None, **overrides: Any) -> dict[str, Any]:
    """`tunesmith eval`: loss/perplexity, predictions with BLEU/ROUGE, or a benchmark."""
    cfg = load(config, **overrides)
    _setup(cfg)
    from tunesmith.evaluation.runner import run_eval

    return run_eval(cfg)


class Chat:
    """A loaded model (base + adapters, merged) answering prompts or message lists."""

    def __init__(self, cfg: Config, device: str = "auto"):
        from tunesmith.infer.engine import HFEngine

        m = cfg.model
        if not m.model_name_or_path:
            raise ConfigError("model_name_or_path: not set; give the model to chat with")
        self.engine = HFEngine(m.model_name_or_path, m.adapter_name_or_path, m.template,
                               device, m.trust_remote_code)

    def __call__(self, prompt: str | list[dict[str, Any]], **sampling: Any) -> str:
        """The answer to `prompt` (a user message or a list of {role, content});
        `sampling`: max_new_tokens, temperature (0: greedy), top_p, top_k,
        repetition_penalty, stop, seed."""
        from tunesmith.infer.engine import GenerationParams

        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        params = GenerationParams(**sampling)
        if params.check():
            raise ConfigError("chat: " + "; ".join(params.check()))
        return self.engine.generate(messages, params)


def chat(config: ConfigSource = None, *, device: str = "auto", **overrides: Any) -> Chat:
    """Load a model for chatting (the keys of `tunesmith chat CONFIG.yaml`)."""
    return Chat(load(config, **overrides), device)
