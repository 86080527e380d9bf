"""The 0.4 % acceptance rule."""

from __future__ import annotations

import pytest

from pytest_precision import PrecisionInputError, assert_score_within, check_scores
from pytest_precision.output._scores import ScoreOutOfTolerance


def test_the_issue_examples() -> None:
    assert_score_within(0.700, 0.702)
    with pytest.raises(ScoreOutOfTolerance) as failure:
        assert_score_within(0.690, 0.702)
    message = str(failure.value)
    assert "-1.71 %" in message
    assert "0.40 %" in message
    assert "FAIL" in message


def test_exactly_at_the_limit_passes() -> None:
    assert_score_within(0.996, 1.0)
    assert not check_scores(0.9959, 1.0).passed


def test_direction_decides_whether_a_rise_counts() -> None:
    assert not check_scores(0.72, 0.70).passed  # both (the default): any change counts
    assert check_scores(0.72, 0.70, direction="drop").passed
    assert not check_scores(0.68, 0.70, direction="drop").passed
    with pytest.raises(PrecisionInputError, match="direction"):
        check_scores(0.7, 0.7, direction="up")  # type: ignore[arg-type]


def test_a_table_of_tasks_fails_with_a_table() -> None:
    scores = {"mmlu": 0.650, "gsm8k": 0.300, "ceval": 0.700}
    baseline = {"mmlu": 0.651, "gsm8k": 0.320, "ceval": 0.700}
    with pytest.raises(ScoreOutOfTolerance) as failure:
        assert_score_within(scores, baseline)
    lines = str(failure.value).splitlines()
    assert lines[0].startswith("1 of 3 score(s)")
    assert any(line.split()[0] == "gsm8k" and line.endswith("FAIL") for line in lines[2:])
    assert any(line.split()[0] == "mmlu" and line.endswith("ok") for line in lines[2:])
    result = failure.value.result
    assert [row.task for row in result.failures] == ["gsm8k"]
    assert check_scores(scores, baseline, rel={"mmlu": 0.004, "gsm8k": 0.1, "ceval": 0}).passed


def test_clear_errors() -> None:
    with pytest.raises(PrecisionInputError, match="no score for baseline task"):
        check_scores({"a": 0.5}, {"a": 0.5, "b": 0.4})
    with pytest.raises(PrecisionInputError, match="no baseline for task"):
        check_scores({"a": 0.5, "c": 1}, {"a": 0.5})
    with pytest.raises(PrecisionInputError, match="not finite"):
        check_scores(float("nan"), 0.5)
    with pytest.raises(PrecisionInputError, match="two numbers or two"):
        check_scores({"a": 0.5}, 0.5)


def test_a_zero_baseline_is_judged_on_the_absolute_change() -> None:
    (row,) = check_scores(0.003, 0.0).rows
    assert not row.relative
    assert row.passed
