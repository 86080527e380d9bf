# ruff: noqa: RUF001  (the prose and garbled samples are deliberately not ASCII)
"""Symptom detectors: planted loops and garbled tails are found; ordinary prose is left alone."""

from __future__ import annotations

import pytest

from pytest_precision import (
    PrecisionInputError,
    assert_no_jitter,
    assert_no_symptoms,
    detect_garbled,
    detect_jitter,
    detect_repetition,
    detect_symptoms,
)
from pytest_precision.output._symptoms import SymptomsFound

ENGLISH = [
    "The quick brown fox jumps over the lazy dog. It was the best of times, it was the worst "
    "of times; the age of wisdom, the age of foolishness.",
    "To install the package, run `pip install pytest-precision`, then call assert_close(a, b)"
    " in your test. Tolerances: rtol=1.6e-2, atol=1e-5 (bf16).\n\n- step 1\n- step 2\n",
    "Dear Sam,\n\tThanks for the notes. The café on 3rd St. opens at 9:00 -- see you there!"
    "\n\nBest, Ana",
    "Hahaha, that's funny!!! ... Well, well, well. Let me think: 1, 2, 3, 4, 5, 6, 7, 8, 9, "
    "10. Done. ------------------------------ The End.",
    "The electron's magnetic moment is about 9.28e-24 J/T, and in the formula E = -μ·B the "
    "angle θ between them matters; Δx Δp ≥ ħ/2. 😀",
]
CHINESE = [
    "大语言模型的推理精度问题通常分为两类：模型结构问题和数值计算问题。前者会导致明显的异常，"
    "后者需要在合理的误差范围内判断。",
    "请先检查权重是否正确加载，再对比 GPU 与 NPU 的配置参数，例如 temperature、top_p 和 "
    "max_new_tokens。使用 PyTorch 2.1 与 transformers 4.45 进行复现。",
    "今天天气很好，我们去公园散步吧！哈哈哈哈。你觉得怎么样？好的好的。",
    "日本語の文章も混ざることがあります。東京は日本の首都です。",
]


@pytest.mark.parametrize("text", ENGLISH + CHINESE)
def test_silent_on_ordinary_prose(text: str) -> None:
    assert detect_symptoms(text) == []
    assert_no_symptoms(text)


def test_a_planted_loop_is_found_with_its_period_and_count() -> None:
    ids = [5, 17, 3, 99, 42, 8, 61] + [7, 8, 9, 10] * 6 + [7, 8]
    (finding,) = detect_repetition(ids)
    assert finding.kind == "repetition"
    assert finding.unit == "token"
    assert finding.period == 4
    assert finding.count == pytest.approx(6.5)
    assert finding.location == 7  # the loop starts right after the prefix
    text = ENGLISH[0] + " and then I said that" * 5
    (finding,) = detect_repetition(text)
    assert finding.period == len(" and then I said that")
    assert finding.count == pytest.approx(5, abs=0.2)


def test_repetition_thresholds_are_arguments() -> None:
    ids = [1, 2, 3] + [4, 5] * 4  # a span of 8: under the default 12
    assert detect_repetition(ids) == []
    assert detect_repetition(ids, min_span=8)[0].period == 2
    assert detect_repetition(ids, min_span=8, min_repeats=5) == []
    padded = [1, 2, 3] + [4] * 12 + [0] * 5
    assert detect_repetition(padded) == []  # the tail is padding, 5 long
    assert detect_repetition(padded, pad_id=0)[0].period == 1
    assert detect_repetition([1, 2, 3, 4] + [0] * 20, pad_id=0) == []


def test_a_garbled_tail_is_found() -> None:
    text = ENGLISH[0] + " The answer is \ufffd\ufffd<unk><unk>\x07 \ufffd"
    findings = detect_garbled(text)
    reasons = " | ".join(f.reason for f in findings)
    assert "3 replacement character(s) U+FFFD" in reasons
    assert "2 '<unk>'" in reasons
    assert "1 control character(s)" in reasons
    first = min(f.location for f in findings)
    assert text[first] == "\ufffd"
    with pytest.raises(SymptomsFound, match="garbled"):
        assert_no_symptoms(text)


def test_a_switch_of_script_is_found() -> None:
    english = ENGLISH[0] + " Then it went: Вопрос ответ привет мир"
    (finding,) = detect_garbled(english)
    assert "CYRILLIC" in finding.reason
    assert english[finding.location] == "В"
    chinese = CHINESE[0] + "мир привет народ"
    (finding,) = detect_garbled(chinese)
    assert "CYRILLIC" in finding.reason
    english_to_chinese = ENGLISH[0] + " 然后模型突然开始说中文了"
    assert "HAN" in detect_garbled(english_to_chinese)[0].reason
    # an expected script is not a switch; a shorter run is not one either
    assert detect_garbled(english, expected_scripts=["Latin", "Cyrillic"]) == []
    assert detect_garbled(english, min_script_run=40) == []


def test_ids_are_checked_by_id_and_through_a_decoder() -> None:
    (finding,) = detect_garbled([5, 6, 3, 3], unk_id=3)
    assert finding.unit == "token"
    assert finding.location == 2
    vocab = {1: "hello", 2: " world", 3: "\ufffd"}
    findings = detect_garbled([1, 2, 3], decode=lambda ids: "".join(vocab[i] for i in ids))
    assert findings[0].location == len("hello world")


def test_jitter_reports_the_first_differing_position() -> None:
    assert detect_jitter(["same answer"] * 3) == []
    findings = detect_jitter([[1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 9, 4], [1, 2, 3]])
    assert [(f.response, f.location) for f in findings] == [(2, 2), (3, 3)]
    assert "response 2 differs from response 0 at token 2: 9 vs 3" in findings[0].reason
    with pytest.raises(SymptomsFound, match="2 of 4 responses"):
        assert_no_jitter([[1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 9, 4], [1, 2, 3]])
    with pytest.raises(PrecisionInputError, match="at least 2"):
        detect_jitter(["one"])
    with pytest.raises(PrecisionInputError, match="not a mix"):
        detect_jitter(["one", [1, 2]])
