"""A Hugging Face byte-level BPE tokenizer as GGUF tokenizer metadata.

llama.cpp's "gpt2" tokenizer model is byte-level BPE: the vocabulary as the tokenizer spells
it (bytes mapped to printable characters), the merges in rank order, a type per token, and a
pre-tokenizer name (`tokenizer.ggml.pre`) that picks the regex splitting text before BPE.
The name is found by behaviour, not by the model's name: the tokenizer's own pre-tokenizer
and each known candidate split a probe text, and the candidate that splits it identically
wins.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from tunesmith.errors import ExportError

# llama.cpp token types (gguf.TokenType)
NORMAL, CONTROL, USER_DEFINED, UNUSED = 1, 3, 4, 5

# The split regexes of the known byte-level BPE families (facts of those tokenizers).
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
               r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

PROBE_TEXT = ("Hello world! I'm 12345 tokens, you'LL see.\n\n  \tdef f(x):\n    return x**2  "
              "# ok?\r\n你好，世界 Привет 🙂 3.14159 e=mc² ...!!")


@dataclass
class GGUFVocab:
    """Everything GGUF stores about a tokenizer."""

    pre: str
    tokens: list[str]
    types: list[int]
    merges: list[str]
    special_ids: dict[str, int] = field(default_factory=dict)  # bos, eos, unk, pad
    add_bos: bool = False
    add_eos: bool = False


def _candidates() -> dict[str, Any]:
    from tokenizers import Regex
    from tokenizers import pre_tokenizers as pt

    def split_then_bytes(regex: str) -> Any:
        return pt.Sequence([pt.Split(Regex(regex), behavior="isolated"),
                            pt.ByteLevel(add_prefix_space=False, use_regex=False)])

    return {
        "gpt-2": pt.ByteLevel(add_prefix_space=False, use_regex=True),
        "smollm": pt.Sequence([pt.Digits(individual_digits=True),
                               pt.ByteLevel(add_prefix_space=False, use_regex=True)]),
        "llama-bpe": split_then_bytes(LLAMA3_SPLIT),
        "qwen2": split_then_bytes(QWEN2_SPLIT),
    }


def detect_pre_tokenizer(backend: Any) -> str:
    """The llama.cpp pre-tokenizer name that splits text exactly as `backend` does.

    Raises:
        ExportError: no known pre-tokenizer matches.
    """
    if backend.pre_tokenizer is None:
        raise ExportError("GGUF export: the tokenizer has no pre-tokenizer; only byte-level BPE "
                          "tokenizers (GPT-2, SmolLM, Llama 3, Qwen2 style) can be exported")
    ours = backend.pre_tokenizer.pre_tokenize_str(PROBE_TEXT)
    for name, candidate in _candidates().items():
        if candidate.pre_tokenize_str(PROBE_TEXT) == ours:
            return name
    raise ExportError(
        "GGUF export: the tokenizer splits text in a way tunesmith does not know how to describe "
        f"to llama.cpp (pre-tokenizer {json.dumps(json.loads(backend.to_str())['pre_tokenizer'])[:300]}); "
        f"known: {', '.join(_candidates())}. Export with export_format: hf and convert with "
        "llama.cpp's convert_hf_to_gguf.py")


def _check_byte_level_bpe(spec: dict[str, Any]) -> None:
    model_type = spec.get("model", {}).get("type")
    byte_level = "ByteLevel" in json.dumps(spec.get("pre_tokenizer")) or "ByteLevel" in (
        json.dumps(spec.get("decoder")))
    if model_type != "BPE" or not byte_level or spec["model"].get("byte_fallback"):
        raise ExportError(
            f"GGUF export supports byte-level BPE tokenizers (GPT-2 style, as in SmolLM, Llama 3, "
            f"Qwen2/2.5/3); this one is {model_type} "
            f"{'with byte fallback (SentencePiece style)' if model_type == 'BPE' else ''}. "
            "Export with export_format: hf and convert with llama.cpp's convert_hf_to_gguf.py")
    normalizer = spec.get("normalizer")
    if normalizer not in (None, {"type": "NFC"}):
        raise ExportError(f"GGUF export: the tokenizer normalises text ({normalizer}), which a "
                          "GGUF byte-level vocabulary cannot express; export with "
                          "export_format: hf")


def _merges(spec: dict[str, Any]) -> list[str]:
    return [m if isinstance(m, str) else " ".join(m) for m in spec["model"].get("merges", [])]


def _adds(tokenizer: Any, token_id: int | None, at_end: bool) -> bool:
    """Whether encoding with special tokens puts `token_id` at the start (or end)."""
    if token_id is None:
        return False
    with_special = tokenizer("a", add_special_tokens=True)["input_ids"]
    plain = tokenizer("a", add_special_tokens=False)["input_ids"]
    if len(with_special) <= len(plain):
        return False
    return (with_special[-1] if at_end else with_special[0]) == token_id


def build_vocab(tokenizer: Any, vocab_size: int) -> GGUFVocab:
    """GGUF tokenizer metadata for a fast tokenizer, padded to the model's `vocab_size`.

    Raises:
        ExportError: not byte-level BPE, an unknown pre-tokenizer, or more tokens than rows in
            the embedding matrix.
    """
    backend = tokenizer.backend_tokenizer
    spec = json.loads(backend.to_str())
    _check_byte_level_bpe(spec)
    pre = detect_pre_tokenizer(backend)
    by_id = {i: t for t, i in backend.get_vocab(with_added_tokens=True).items()}
    if by_id and max(by_id) >= vocab_size:
        raise ExportError(f"GGUF export: the tokenizer has token id {max(by_id)} but the model "
                          f"has only {vocab_size} embedding rows; resize the embeddings first")
    added = tokenizer.added_tokens_decoder
    tokens, types = [], []
    for i in range(vocab_size):
        if i not in by_id:  # embedding rows no token maps to (vocabularies padded for speed)
            tokens.append(f"[PAD{i}]")
            types.append(UNUSED)
        else:
            tokens.append(by_id[i])
            types.append((CONTROL if added[i].special else USER_DEFINED) if i in added
                         else NORMAL)
    special = {"bos": tokenizer.bos_token_id, "eos": tokenizer.eos_token_id,
               "unk": tokenizer.unk_token_id, "pad": tokenizer.pad_token_id}
    return GGUFVocab(pre=pre, tokens=tokens, types=types, merges=_merges(spec),
                     special_ids={k: v for k, v in special.items() if v is not None},
                     add_bos=_adds(tokenizer, tokenizer.bos_token_id, at_end=False),
                     add_eos=_adds(tokenizer, tokenizer.eos_token_id, at_end=True))
