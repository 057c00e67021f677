"""Tiny models and a tiny tokenizer, built offline in the test process.

The tokenizer is a byte-level BPE trained on a few sentences (any unicode text encodes),
with ChatML special tokens and the ChatML template; models are 2-layer Llama / Qwen2
configs with GQA, random weights from a fixed seed.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + "
          "message['content'] + '<|im_end|>' + '\n' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")

CORPUS = [
    "Who are you? I am a helpful assistant made by the tunesmith team.",
    "The quick brown fox jumps over the lazy dog. 0123456789",
    "Translate to French: hello world -> bonjour le monde. Ça va? Très bien!",
    "def add(a, b):\n    return a + b  # Python code with    spaces and\ttabs",
    "你好，世界。こんにちは。Привет, мир! 🙂 emojis and unicode",
    "system user assistant tool function call arguments name content role",
    "Question: what is 2 + 2? Answer: 4. Instruction, input, output, response.",
]
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def build_tokenizer(vocab_size: int = 384):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(CORPUS * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|im_start|>",
                                   eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   unk_token=None)
    fast.chat_template = CHATML
    return fast


def build_model(arch: str = "llama", vocab_size: int = 384, seed: int = 0,
                hidden: int = 64, layers: int = 2, tie: bool = False, max_positions: int = 512):
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    common = dict(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=hidden * 2,
                  num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=max_positions, tie_word_embeddings=tie, bos_token_id=1,
                  eos_token_id=2, pad_token_id=0)
    cfg = LlamaConfig(**common) if arch == "llama" else Qwen2Config(**common)
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(cfg, dtype=torch.float32,
                                            attn_implementation="sdpa")


def save_tiny_model(folder: Path, arch: str = "llama", seed: int = 0, **kw) -> Path:
    """A complete model folder (safetensors + tokenizer with template) on disk."""
    tok = build_tokenizer()
    model = build_model(arch, vocab_size=len(tok), seed=seed, **kw)
    model.config.bos_token_id = tok.bos_token_id
    model.config.eos_token_id = tok.eos_token_id
    model.config.pad_token_id = tok.pad_token_id
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def write_alpaca(path: Path, n: int = 24) -> Path:
    rows = [{"instruction": f"Question {i}: what is {i} + {i}?", "input": "",
             "output": f"The answer is {2 * i}."} for i in range(n)]
    path.write_text(json.dumps(rows, indent=1), encoding="utf-8")
    return path
