"""BLEU-4 and ROUGE against values worked out by hand."""

from __future__ import annotations

import math

import pytest

from tunesmith.evaluation.metrics import (
    bleu4,
    lcs_length,
    metric_tokens,
    rouge_l,
    rouge_n,
    score_predictions,
)

HYP = "the cat sat on the mat"
REF = "the cat is on the mat"


def test_tokens_split_cjk_into_characters():
    assert metric_tokens("Hello, world! 我爱北京 ok") == ["Hello", ",", "world", "!", "我", "爱",
                                                      "北", "京", "ok"]


def test_english_sentence_by_hand():
    h, r = metric_tokens(HYP), metric_tokens(REF)
    # unigram 5/6, bigram 3/5, trigram 1/4, no 4-gram match: 1/(2^1 * 3)
    assert bleu4(h, r) == pytest.approx((5 / 6 * 3 / 5 * 1 / 4 * 1 / 6) ** 0.25)
    assert rouge_n(h, r, 1) == pytest.approx(5 / 6)
    assert rouge_n(h, r, 2) == pytest.approx(3 / 5)
    assert lcs_length(h, r) == 5
    assert rouge_l(h, r) == pytest.approx(5 / 6)


def test_chinese_by_hand():
    h, r = metric_tokens("我爱北京"), metric_tokens("我爱上海")
    # p1 2/4, p2 1/3, p3 none of 2 -> 1/(2*2), p4 none of 1 -> 1/(4*1)
    assert bleu4(h, r) == pytest.approx((1 / 2 * 1 / 3 * 1 / 4 * 1 / 4) ** 0.25)
    assert rouge_n(h, r, 1) == pytest.approx(0.5)
    assert rouge_n(h, r, 2) == pytest.approx(1 / 3)
    assert rouge_l(h, r) == pytest.approx(0.5)


def test_brevity_penalty_and_edge_cases():
    h, r = metric_tokens("the cat"), metric_tokens(HYP)
    # c=2, r=6: BP = exp(1 - 3); p1 = p2 = 1, p3 = 1/(2*1), p4 = 1/(4*1)
    assert bleu4(h, r) == pytest.approx(math.exp(-2) * (0.5 * 0.25) ** 0.25)
    assert bleu4(metric_tokens(HYP), metric_tokens(HYP)) == pytest.approx(1.0)
    assert bleu4([], r) == 0.0 and bleu4(["dog"], r) == 0.0
    assert rouge_l([], r) == 0.0 and rouge_n(["x"], ["y"], 1) == 0.0


def test_scores_are_means_times_100():
    scores = score_predictions([HYP, "我爱北京"], [REF, "我爱上海"])
    assert scores["predict_rouge-1"] == pytest.approx(100 * (5 / 6 + 0.5) / 2, abs=1e-4)
    assert scores["predict_rouge-2"] == pytest.approx(100 * (3 / 5 + 1 / 3) / 2, abs=1e-4)
    assert scores["predict_rouge-l"] == pytest.approx(100 * (5 / 6 + 0.5) / 2, abs=1e-4)
    with pytest.raises(ValueError):
        score_predictions(["a"], [])
