"""BLEU-4 and ROUGE-1/2/L on single sentences, written out so every number can be checked
by hand.

Tokens: each CJK ideograph, kana or hangul syllable is one token (those scripts have no
spaces); other text splits into runs of word characters and single punctuation marks.
"""

from __future__ import annotations

import math
import re
from collections import Counter

_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"
_TOKEN = re.compile(rf"[{_CJK}]|[^\W{_CJK}]+|[^\w\s]")


def metric_tokens(text: str) -> list[str]:
    """Split text into the tokens BLEU and ROUGE count."""
    return _TOKEN.findall(text)


def ngram_counts(tokens: list[str], n: int) -> Counter[tuple[str, ...]]:
    return Counter(tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1))


def bleu4(hyp: list[str], ref: list[str]) -> float:
    """Sentence BLEU with n = 1..4, equal weights and the brevity penalty.

    An order with no matching n-gram would zero the score; it counts instead as
    1 / (2^k * max(total, 1)), k = 1, 2, ... for the first, second, ... such order (geometric
    smoothing). No matching unigram at all gives 0.
    """
    if not hyp or not ref:
        return 0.0
    log_sum, k = 0.0, 0
    for n in range(1, 5):
        h, r = ngram_counts(hyp, n), ngram_counts(ref, n)
        total = sum(h.values())
        matches = sum(min(c, r[g]) for g, c in h.items())
        if n == 1 and matches == 0:
            return 0.0
        if matches == 0:
            k += 1
            precision = 1.0 / (2**k * max(total, 1))
        else:
            precision = matches / total
        log_sum += math.log(precision) / 4
    brevity = 1.0 if len(hyp) > len(ref) else math.exp(1 - len(ref) / len(hyp))
    return brevity * math.exp(log_sum)


def _f1(overlap: int, n_hyp: int, n_ref: int) -> float:
    if overlap == 0 or n_hyp == 0 or n_ref == 0:
        return 0.0
    p, r = overlap / n_hyp, overlap / n_ref
    return 2 * p * r / (p + r)


def rouge_n(hyp: list[str], ref: list[str], n: int) -> float:
    """ROUGE-N F1: clipped n-gram overlap over the hypothesis's and reference's n-grams."""
    h, r = ngram_counts(hyp, n), ngram_counts(ref, n)
    overlap = sum(min(c, r[g]) for g, c in h.items())
    return _f1(overlap, sum(h.values()), sum(r.values()))


def lcs_length(a: list[str], b: list[str]) -> int:
    """Length of the longest common subsequence (one row of the table at a time)."""
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0]
        for j, y in enumerate(b):
            cur.append(prev[j] + 1 if x == y else max(prev[j + 1], cur[j]))
        prev = cur
    return prev[-1]


def rouge_l(hyp: list[str], ref: list[str]) -> float:
    """ROUGE-L F1 from the longest common subsequence."""
    return _f1(lcs_length(hyp, ref), len(hyp), len(ref))


def score_predictions(predictions: list[str], references: list[str]) -> dict[str, float]:
    """Mean sentence scores x 100, under LLaMA-Factory's result names."""
    if len(predictions) != len(references) or not predictions:
        raise ValueError(f"need as many predictions as references, got {len(predictions)} and "
                         f"{len(references)}")
    sums = {"predict_bleu-4": 0.0, "predict_rouge-1": 0.0, "predict_rouge-2": 0.0,
            "predict_rouge-l": 0.0}
    for pred, label in zip(predictions, references, strict=True):
        h, r = metric_tokens(pred), metric_tokens(label)
        sums["predict_bleu-4"] += bleu4(h, r)
        sums["predict_rouge-1"] += rouge_n(h, r, 1)
        sums["predict_rouge-2"] += rouge_n(h, r, 2)
        sums["predict_rouge-l"] += rouge_l(h, r)
    return {k: round(100 * v / len(predictions), 4) for k, v in sums.items()}
