"""One inference engine interface, with a Hugging Face backend.

The engine loads a base model, merges any adapters into it, and renders prompts with the
chat template the adapter was trained with (saved beside it), so chat matches training.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from tunesmith.adapters.setup import load_adapters
from tunesmith.data.template import ChatRenderer, load_template_source
from tunesmith.errors import ConfigError, ModelError
from tunesmith.models.loader import load_causal_lm, load_tokenizer, pick_device
from tunesmith.models.provision import resolve_model_path

log = logging.getLogger(__name__)


@dataclass
class GenerationParams:
    max_new_tokens: int = 256
    temperature: float = 0.7  # 0 means greedy
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    repetition_penalty: float = 1.0
    stop: list[str] = field(default_factory=list)
    seed: int | None = None


class Engine(Protocol):
    def stream(self, messages: list[dict[str, Any]], params: GenerationParams
               ) -> Iterator[str]: ...


def _adapter_template(paths: list[str]) -> str | None:
    """The chat template saved with the last adapter that has one."""
    for path in reversed(paths):
        folder = Path(path)
        jinja = folder / "chat_template.jinja"
        if jinja.is_file():
            return jinja.read_text(encoding="utf-8")
        cfg = folder / "tokenizer_config.json"
        if cfg.is_file():
            import json

            value = json.loads(cfg.read_text()).get("chat_template")
            if isinstance(value, str):
                return value
    return None


class HFEngine:
    def __init__(self, model_name_or_path: str, adapter_name_or_path: list[str] | None = None,
                 template: str = "", device: str = "auto", trust_remote_code: bool = False,
                 cache_dir: str | None = None):
        adapters = adapter_name_or_path or []
        for a in adapters:
            if not (Path(a) / "adapter_config.json").is_file():
                raise ModelError(f"adapter_name_or_path: {a!r} is not a PEFT adapter folder (no "
                                 "adapter_config.json); give the output_dir of a LoRA run")
        self.device = pick_device(device)
        path = resolve_model_path(model_name_or_path, cache_dir)
        self.name = Path(model_name_or_path).name if adapters == [] else Path(adapters[-1]).name
        self.tokenizer = load_tokenizer(adapters[-1] if _has_tokenizer(adapters) else path,
                                        trust_remote_code=trust_remote_code)
        trained = _adapter_template(adapters)
        if template and trained is not None:
            _, requested = load_template_source(template, self.tokenizer)
            if requested != trained:
                raise ConfigError(f"template: {template!r} differs from the template the adapter "
                                  f"{adapters[-1]!r} was trained with; drop --template to use "
                                  "the adapter's own")
        if trained is not None:
            name, source = "adapter", trained
        else:
            name, source = load_template_source(template, self.tokenizer)
        self.renderer = ChatRenderer(name, source, self.tokenizer)
        dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        model = load_causal_lm(path, dtype=dtype, trust_remote_code=trust_remote_code,
                               device=self.device)
        if adapters:
            model = load_adapters(model, adapters, trainable=False)
        self.model = model.eval()
        self._lock = threading.Lock()

    def stream(self, messages: list[dict[str, Any]], params: GenerationParams) -> Iterator[str]:
        """Yield text pieces as they are generated."""
        from transformers import TextIteratorStreamer

        prompt = self.renderer.prompt_text(messages)
        enc = self.tokenizer(prompt, add_special_tokens=False, return_tensors="pt")
        enc = {k: v.to(self.device) for k, v in enc.items()}
        streamer = TextIteratorStreamer(self.tokenizer, skip_prompt=True,
                                        skip_special_tokens=True)
        kwargs = dict(**enc, streamer=streamer, **self._sampling_kwargs(params))
        errors: list[BaseException] = []

        def work() -> None:
            try:
                with self._lock, torch.no_grad():
                    if params.seed is not None:
                        torch.manual_seed(params.seed)
                    self.model.generate(**kwargs)
            except BaseException as exc:  # surfaced in the caller's thread
                errors.append(exc)
                streamer.end()

        thread = threading.Thread(target=work, daemon=True)
        thread.start()
        text = ""
        for piece in streamer:
            text += piece
            cut = _stop_index(text, params.stop)
            if cut is not None:
                yield piece[: len(piece) - (len(text) - cut)]
                break
            yield piece
        thread.join()
        if errors:
            raise errors[0]

    def generate(self, messages: list[dict[str, Any]], params: GenerationParams) -> str:
        return "".join(self.stream(messages, params))

    def _sampling_kwargs(self, p: GenerationParams) -> dict[str, Any]:
        kw: dict[str, Any] = {"max_new_tokens": p.max_new_tokens,
                              "repetition_penalty": p.repetition_penalty,
                              "pad_token_id": self.tokenizer.pad_token_id}
        if p.temperature > 0:
            kw.update(do_sample=True, temperature=p.temperature, top_p=p.top_p, top_k=p.top_k)
        else:
            kw.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        return kw


def _has_tokenizer(adapters: list[str]) -> bool:
    return bool(adapters) and (Path(adapters[-1]) / "tokenizer_config.json").is_file()


def _stop_index(text: str, stops: list[str]) -> int | None:
    hits = [text.find(s) for s in stops if s and s in text]
    return min(hits) if hits else None
