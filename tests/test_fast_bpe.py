"""The tiktoken path for byte-level BPE tokenizers gives the Hugging Face tokenizer's ids,
and switches itself off when it ever would not."""

from __future__ import annotations

from pathlib import Path

import pytest

from tunesmith.data.fast_bpe import build_fast_bpe

pytest.importorskip("tiktoken")
TOKENIZERS = Path(__file__).parent / "fixtures" / "templates" / "tokenizers"
TEXTS = ["Hello, how are you?", "Grüße! 你好 🎉 it's  two  spaces\n\n\ttab 12345 ''",
         "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", "   ", "end   ",
         "a\r\nb", "<think>\n\n</think>\n\n", "x" * 300, "\u0004 rare byte \u00c0"]


def load(name: str):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(str(TOKENIZERS / name))


@pytest.mark.parametrize("which", ["fixture", "tiny"])
@pytest.mark.parametrize("identity", [True, False])
def test_fast_path_equals_the_tokenizer(which, identity, tiny_tokenizer):
    tok = load("bpe") if which == "fixture" else tiny_tokenizer
    fast = build_fast_bpe(tok)
    assert fast is not None and fast.identity  # both vocabularies are in merge order
    if not identity:  # the general path: ranks mapped to ids through a table
        fast.identity, fast.id_of_rank = False, _identity_table(fast)
    got = fast.encode_batch(TEXTS * 3)
    assert fast.enabled and got == [tok.encode(t, add_special_tokens=False) for t in TEXTS * 3]


def test_not_byte_level_keeps_the_tokenizer():
    assert build_fast_bpe(load("sp")) is None


def _identity_table(fast):
    """With ids as ranks, the rank -> id table is the identity over the ids in use."""
    import numpy as np

    return np.arange(int(fast.id_of_rank.max()) + 1, dtype=np.int64)


def test_a_difference_switches_the_fast_path_off(tiny_tokenizer):
    fast = build_fast_bpe(tiny_tokenizer)
    fast.identity, fast.id_of_rank = False, _identity_table(fast)
    a, b = 300, 301  # two merge results swapped
    fast.id_of_rank[300], fast.id_of_rank[301] = b, a
    texts = [tiny_tokenizer.decode([int(a)]) * 3, tiny_tokenizer.decode([int(b)]) * 3] + TEXTS
    assert fast.encode_batch(texts) is None and not fast.enabled
    assert fast.encode_batch(TEXTS) is None  # off for good
