"""Inputs of the end-to-end benchmark, built on the machine that runs it (no downloads):
a Qwen2.5-shaped model with random weights saved as a Hugging Face folder, a byte-level BPE
tokenizer trained on the benchmark's own words, an alpaca file whose answers follow a
log-normal length distribution (mean about 353 tokens), a file of long samples for dense
2048-token rows, and a dataset_info.json naming both (LLaMA-Factory reads datasets by name).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from tunesmith.benchmarks.workloads import SHAPES

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + "
          "message['content'] + '<|im_end|>' + '\n' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


@dataclass(frozen=True)
class Assets:
    model_dir: Path
    data_dir: Path  # holds dataset_info.json, alpaca.json, dense.json
    n_samples: int


def build_assets(work: Path, shape: str, n_samples: int, device: torch.device,
                 seed: int = 0) -> Assets:
    """Everything the benchmark's runs read (rebuilt only when missing)."""
    work.mkdir(parents=True, exist_ok=True)
    model_dir, data_dir = work / f"model-{shape}", work / "data"
    words = _words(4000, seed)
    if not (model_dir / "config.json").is_file():
        tokenizer = build_tokenizer(words)
        save_random_model(model_dir, shape, tokenizer, device)
    if not (data_dir / "dataset_info.json").is_file():
        write_datasets(data_dir, words, n_samples, seed)
    return Assets(model_dir, data_dir, n_samples)


def _words(n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    return sorted({"".join(rng.choice(letters, size=int(rng.integers(3, 8)))) for _ in range(n)})


def build_tokenizer(words: list[str]):
    """Byte-level BPE whose vocabulary holds every benchmark word (one token each)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=8192, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([" ".join(words)] * 50 + [" " + w for w in words] * 20,
                            trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>", bos_token=None, unk_token=None)
    fast.chat_template = CHATML
    return fast


def save_random_model(folder: Path, shape: str, tokenizer, device: torch.device) -> None:
    """Random bf16 weights (fp32 on CPU) written as safetensors with the tokenizer."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    dims = {**SHAPES[shape], "vocab_size": max(SHAPES[shape]["vocab_size"], len(tokenizer))}
    cfg = Qwen2Config(**dims, use_cache=False,
                      pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                      bos_token_id=tokenizer.eos_token_id)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    tmp = folder.with_name(folder.name + ".partial")
    model.save_pretrained(tmp, max_shard_size="5GB")
    tokenizer.save_pretrained(tmp)
    del model
    tmp.rename(folder)


def lognormal_token_counts(n: int, mean: float, seed: int, sigma: float = 0.9,
                           lo: int = 8, hi: int = 1900) -> list[int]:
    """Counts with the given mean (before clipping) and a long right tail."""
    rng = np.random.default_rng(seed)
    mu = math.log(mean) - sigma * sigma / 2
    return np.clip(np.round(rng.lognormal(mu, sigma, size=n)), lo, hi).astype(int).tolist()


def write_datasets(folder: Path, words: list[str], n: int, seed: int) -> None:
    rng = np.random.default_rng(seed + 1)
    vocab = np.array(words)

    def text(count: int) -> str:
        return " ".join(rng.choice(vocab, size=count))

    # prompt ~ 1/6 of a sample, answer the rest; template tokens add about 10
    counts = lognormal_token_counts(n, 343.0, seed)
    alpaca = [{"instruction": text(max(2, c // 6)), "input": "", "output": text(c - c // 6)}
              for c in counts]
    dense = [{"instruction": text(40), "input": "", "output": text(2100)}
             for _ in range(max(64, n // 16))]
    tmp = folder.with_name(folder.name + ".partial")
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "alpaca.json").write_text(json.dumps(alpaca))
    (tmp / "dense.json").write_text(json.dumps(dense))
    info = {name: {"file_name": f"{name}.json"} for name in ("alpaca", "dense")}
    (tmp / "dataset_info.json").write_text(json.dumps(info, indent=1))
    tmp.rename(folder)
