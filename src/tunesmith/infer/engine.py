"""One inference engine interface, with a Hugging Face backend.

The engine loads a base model, merges any adapters into it, and renders prompts with the
chat template the adapter was trained with (saved beside it), so chat matches training.
Generation keeps the KV cache on; one prompt streams token by token, several prompts run
as one left-padded batch.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import torch

from tunesmith.adapters.saved import saved_chat_template
from tunesmith.adapters.setup import load_adapters
from tunesmith.data.template import ChatRenderer, load_template_source
from tunesmith.errors import ConfigError, ModelError
from tunesmith.infer.streaming import CancelCriteria, TextAssembler, TokenQueue
from tunesmith.infer.vision import encode_vision_prompt, has_images
from tunesmith.models.loader import load_causal_lm, load_tokenizer, pick_device
from tunesmith.models.processor import is_vision_model, read_vision_settings
from tunesmith.models.provision import resolve_model_path

log = logging.getLogger(__name__)

FinishReason = Literal["stop", "length"]


@dataclass
class GenerationParams:
    max_new_tokens: int = 256
    temperature: float = 0.7  # 0 means greedy
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    repetition_penalty: float = 1.0
    stop: list[str] = field(default_factory=list)
    seed: int | None = None

    def check(self) -> list[str]:
        """Problems with the values, each naming the parameter and the valid range."""
        problems = []
        if self.max_new_tokens < 1:
            problems.append(f"max_new_tokens {self.max_new_tokens} must be >= 1")
        if self.temperature < 0:
            problems.append(f"temperature {self.temperature} must be >= 0 (0: greedy)")
        if not 0 < self.top_p <= 1:
            problems.append(f"top_p {self.top_p} must be in (0, 1]")
        if self.top_k < 0:
            problems.append(f"top_k {self.top_k} must be >= 0 (0: off)")
        if self.repetition_penalty <= 0:
            problems.append(f"repetition_penalty {self.repetition_penalty} must be > 0")
        return problems


@dataclass
class Chunk:
    """A piece of streamed text; the last chunk of a stream also carries the totals."""

    text: str
    finish_reason: FinishReason | None = None
    completion_tokens: int = 0


@dataclass
class Completion:
    text: str
    finish_reason: FinishReason
    prompt_tokens: int
    completion_tokens: int


class Engine(Protocol):
    name: str

    def stream(self, messages: list[dict[str, Any]], params: GenerationParams
               ) -> Iterator[str]: ...

    def generate(self, messages: list[dict[str, Any]], params: GenerationParams) -> str: ...


def check_adapters(adapters: list[str]) -> None:
    """Raise ModelError naming the first adapter path that is not a PEFT adapter folder."""
    for a in adapters:
        folder = Path(a)
        if not folder.exists():
            raise ModelError(f"adapter_name_or_path: {a!r} does not exist; give the output_dir "
                             "of a LoRA run (a folder holding adapter_config.json)")
        if not (folder / "adapter_config.json").is_file():
            raise ModelError(f"adapter_name_or_path: {a!r} is not a PEFT adapter folder (no "
                             "adapter_config.json); give the output_dir of a LoRA run")


class HFEngine:
    """transformers backend: CPU (fp32) or CUDA (bf16), KV cache, streaming, batching."""

    # Text only: the API answers image parts with a 400. A vision-language engine (vision
    # settings read from the model folder) takes messages with an "images" list and an
    # <image> placeholder per image (serve/app.py -> infer/vision.encode_vision_prompt).
    accepts_images = False
    vision = None

    def __init__(self, model_name_or_path: str, adapter_name_or_path: list[str] | None = None,
                 template: str = "", device: str = "auto", trust_remote_code: bool = False,
                 cache_dir: str | None = None):
        adapters = adapter_name_or_path or []
        check_adapters(adapters)
        self.device = pick_device(device)
        path = resolve_model_path(model_name_or_path, cache_dir)
        self.model_path = path
        self.name = Path(model_name_or_path).name if adapters == [] else Path(adapters[-1]).name
        self.tokenizer = load_tokenizer(adapters[-1] if _has_tokenizer(adapters) else path,
                                        trust_remote_code=trust_remote_code)
        self.renderer = _pick_renderer(template, adapters, self.tokenizer)
        self.vision = (read_vision_settings(path, self.tokenizer) if is_vision_model(path)
                       else None)
        self.accepts_images = self.vision is not None
        dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        model = load_causal_lm(path, dtype=dtype, trust_remote_code=trust_remote_code,
                               device=self.device)
        if adapters:
            model = load_adapters(model, adapters, trainable=False)
        self.model = model.eval()
        self.eos_ids = _eos_ids(self.model, self.tokenizer)
        self.max_length = int(getattr(self.model.config, "max_position_embeddings", 0) or 0)
        self._lock = threading.Lock()  # one generate() at a time on the shared model
        self.attention = self.model.config._attn_implementation  # generate() runs with this

    @classmethod
    def from_model(cls, model: torch.nn.Module, tokenizer: Any, name: str,
                   template: str = "") -> HFEngine:
        """An engine over a model already in memory (benchmarks, tests, the web UI)."""
        engine = cls.__new__(cls)
        engine.device = next(model.parameters()).device
        engine.name, engine.tokenizer = name, tokenizer
        engine.renderer = _pick_renderer(template, [], tokenizer)
        engine.model = model.eval()
        engine.eos_ids = _eos_ids(model, tokenizer)
        engine.max_length = int(getattr(model.config, "max_position_embeddings", 0) or 0)
        engine._lock = threading.Lock()
        engine.attention = model.config._attn_implementation
        return engine

    # -- prompts ------------------------------------------------------------------------

    def encode_chat(self, messages: list[dict[str, Any]], tools: list | None = None
                    ) -> list[int]:
        """Token ids of the rendered conversation (and tools) plus the generation prompt."""
        text = self.renderer.prompt_text(messages, tools)
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def encode_text(self, text: str) -> list[int]:
        """Token ids of a raw text prompt (completions), with the tokenizer's own specials."""
        return self.tokenizer(text)["input_ids"]

    # -- streaming ------------------------------------------------------------------------
    def stream(self, messages: list[dict[str, Any]], params: GenerationParams) -> Iterator[str]:
        """Yield text pieces as they are generated (messages may carry `images`)."""
        extra: dict[str, Any] = {}
        if has_images(messages):
            ids, extra = encode_vision_prompt(messages, self.renderer, self.tokenizer,
                                              self.vision, self.model)
        else:
            ids = self.encode_chat(messages)
        for chunk in self.stream_ids(ids, params, extra):
            if chunk.text:
                yield chunk.text

    def generate(self, messages: list[dict[str, Any]], params: GenerationParams) -> str:
        return "".join(self.stream(messages, params))

    def stream_ids(self, prompt_ids: list[int], params: GenerationParams,
                   extra: dict[str, Any] | None = None) -> Iterator[Chunk]:
        """Stream the continuation of one prompt. Closing the iterator early stops generation.
        `extra`: more `generate` inputs of this one prompt (a vision prompt's pixels).

        The last chunk carries finish_reason ("stop": end-of-sequence token or stop string;
        "length": max_new_tokens reached) and the number of generated tokens.
        """
        rows = self.stream_batch([prompt_ids], [params], [threading.Event()], extra)
        with contextlib.closing(rows):
            for _, chunk in rows:
                yield chunk

    def stream_batch(self, prompts: list[list[int]], params: list[GenerationParams],
                     cancelled: list[threading.Event], extra: dict[str, Any] | None = None
                     ) -> Iterator[tuple[int, Chunk]]:
        """Stream several prompts through one left-padded generate call, as (row, chunk).

        Rows share the sampling settings of params[0] (temperature, top_p, top_k,
        repetition_penalty, seed); max_new_tokens and stop strings are per row. A row whose
        `cancelled` event is set is dropped; generation stops once every row has finished or
        been dropped (or the iterator is closed). Each row's last chunk carries its
        finish_reason and token count.
        """
        ids, mask = self._left_pad(prompts)
        longest = max(p.max_new_tokens for p in params)
        shared = dataclasses.replace(params[0], max_new_tokens=longest)
        streamer, stop_all = TokenQueue(), threading.Event()
        kwargs = self._generate_kwargs(shared, ids, mask, stop_all)
        kwargs["streamer"] = streamer
        kwargs.update({k: v.to(self.device) for k, v in (extra or {}).items()})
        errors: list[BaseException] = []
        thread = self._start_generate(kwargs, shared.seed, streamer, errors)
        rows = [RowText(TextAssembler(self.tokenizer, p.stop, self.eos_ids), p.max_new_tokens)
                for p in params]
        try:
            for new in streamer:  # one new token per row
                for i, token in enumerate(new):
                    yield from advance_row(i, rows[i], token, cancelled[i])
                if all(r.done for r in rows):
                    break
        finally:
            stop_all.set()  # every row done, or the caller closed us early
            thread.join()
        if errors:
            raise errors[0]
        for i, row in enumerate(rows):  # generate ended first (end-of-sequence everywhere)
            if not row.done and not cancelled[i].is_set():
                yield i, row.finish()

    # -- batches ------------------------------------------------------------------------
    def generate_batch(self, prompts: list[list[int]], params: GenerationParams
                       ) -> list[Completion]:
        """Generate for several prompts at once (left padding); one Completion per prompt."""
        if not prompts:
            return []
        ids, mask = self._left_pad(prompts)
        kwargs = self._generate_kwargs(params, ids, mask, threading.Event())
        out = self._run_generate(kwargs, params.seed)[:, ids.shape[1]:].tolist()  # [B, new]
        results = []
        for prompt, new in zip(prompts, out, strict=True):
            text = TextAssembler(self.tokenizer, params.stop, self.eos_ids)
            body = text.add(new)
            produced = _produced(new, self.eos_ids)
            body += text.flush()
            reason: FinishReason = "stop" if text.stopped or produced < params.max_new_tokens \
                else "length"
            results.append(Completion(body, reason, len(prompt), produced))
        return results

    def generate_texts(self, conversations: list[list[dict[str, Any]]],
                       params: GenerationParams) -> list[Completion]:
        """Chat-render and batch-generate several conversations."""
        return self.generate_batch([self.encode_chat(m) for m in conversations], params)

    def use_attention(self, name: str) -> None:
        """Switch the model's attention function (the continuous batcher uses its own); call
        with the lock held. Switching is skipped when it is already in use."""
        if self.model.config._attn_implementation != name:
            self.model.set_attn_implementation(name)

    # -- internals ----------------------------------------------------------------------
    def _left_pad(self, prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Token ids and attention mask, [B, T], padded on the left."""
        width = max(len(p) for p in prompts)
        pad = self.tokenizer.pad_token_id
        ids = torch.tensor([[pad] * (width - len(p)) + list(p) for p in prompts],
                           dtype=torch.long, device=self.device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts],
                            dtype=torch.long, device=self.device)
        return ids, mask

    def _start_generate(self, kwargs: dict[str, Any], seed: int | None, streamer: TokenQueue,
                        errors: list[BaseException]) -> threading.Thread:
        def work() -> None:
            try:
                self._run_generate(kwargs, seed)
            except BaseException as exc:  # surfaced in the caller's thread
                errors.append(exc)
                streamer.end()

        thread = threading.Thread(target=work, daemon=True, name="tunesmith-generate")
        thread.start()
        return thread

    def _run_generate(self, kwargs: dict[str, Any], seed: int | None) -> torch.Tensor:
        with self._lock, torch.inference_mode():
            self.use_attention(self.attention)
            if seed is not None:
                torch.manual_seed(seed)
            return self.model.generate(**kwargs)

    def _generate_kwargs(self, p: GenerationParams, ids: torch.Tensor, mask: torch.Tensor,
                         cancel: threading.Event) -> dict[str, Any]:
        from transformers import StoppingCriteriaList

        kw: dict[str, Any] = {
            "input_ids": ids, "attention_mask": mask, "use_cache": True,
            "max_new_tokens": p.max_new_tokens, "repetition_penalty": p.repetition_penalty,
            "pad_token_id": self.tokenizer.pad_token_id, "eos_token_id": sorted(self.eos_ids),
            "stopping_criteria": StoppingCriteriaList([CancelCriteria(cancel)])}
        if p.temperature > 0:
            kw.update(do_sample=True, temperature=p.temperature, top_p=p.top_p, top_k=p.top_k)
        else:
            kw.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        return kw


@dataclass
class RowText:
    """One prompt's progress inside a batched stream."""

    text: TextAssembler
    limit: int
    received: int = 0
    done: bool = False

    def finish(self) -> Chunk:
        self.done = True
        tail = self.text.flush()
        stopped = self.text.stopped or self.received < self.limit
        return Chunk(tail, "stop" if stopped else "length", self.received)


def advance_row(i: int, row: RowText, token: int, cancelled: threading.Event
             ) -> Iterator[tuple[int, Chunk]]:
    if row.done:
        return
    if cancelled.is_set():
        row.done = True
        return
    row.received += 1
    piece = row.text.add([token])
    if piece:
        yield i, Chunk(piece)
    if row.text.stopped or row.received >= row.limit:
        yield i, row.finish()


def _pick_renderer(template: str, adapters: list[str], tokenizer: Any) -> ChatRenderer:
    trained = saved_chat_template(adapters)
    if template and trained is not None:
        _, requested = load_template_source(template, tokenizer)
        if requested.strip() != trained.strip():
            raise ConfigError(f"template: {template!r} differs from the chat template the "
                              f"adapter {adapters[-1]!r} was trained with (saved in its "
                              "tokenizer files); drop template to use the adapter's own")
    if trained is not None:
        return ChatRenderer("adapter", trained, tokenizer)
    name, source = load_template_source(template, tokenizer)
    return ChatRenderer(name, source, tokenizer)


def _eos_ids(model: torch.nn.Module, tokenizer: Any) -> set[int]:
    """End-of-sequence ids: the generation config's and the tokenizer's."""
    ids: set[int] = set()
    gen = getattr(model, "generation_config", None)
    value = getattr(gen, "eos_token_id", None) if gen is not None else None
    for v in value if isinstance(value, list) else [value]:
        if v is not None:
            ids.add(int(v))
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return ids


def _produced(new: list[int], eos_ids: set[int]) -> int:
    """Generated tokens up to and including the first end-of-sequence token (the rest is
    padding added after that row finished)."""
    for i, t in enumerate(new):
        if t in eos_ids:
            return i + 1
    return len(new)


def _has_tokenizer(adapters: list[str]) -> bool:
    return bool(adapters) and (Path(adapters[-1]) / "tokenizer_config.json").is_file()
