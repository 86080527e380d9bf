"""first_divergent_token against a brute-force scan, and the token / logprob judgement."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_precision import (
    PrecisionInputError,
    assert_tokens_close,
    compare_tokens,
    first_divergent_token,
)
from pytest_precision.output._tokens import TokensDiverged

PAD = 0
tokens = st.integers(min_value=1, max_value=5)  # a small alphabet: agreements are common
rows = st.lists(tokens, max_size=12)


def _pad(row: list[int], left: int, right: int) -> list[int]:
    return [PAD] * left + row + [PAD] * right


def _brute(golden: list[int], target: list[int]) -> tuple[int | None, int | None, int | None]:
    for i in range(max(len(golden), len(target))):
        a = golden[i] if i < len(golden) else None
        b = target[i] if i < len(target) else None
        if a != b:
            return i, a, b
    return None, None, None


@settings(max_examples=200, deadline=None)
@given(golden=rows, target=rows)
def test_one_sequence_matches_a_brute_force_scan(golden: list[int], target: list[int]) -> None:
    d = first_divergent_token(golden, target)
    assert (d.position, d.golden_token, d.target_token) == _brute(golden, target)
    assert d.row is None
    assert d.diverged == (golden != target)


@settings(max_examples=100, deadline=None)
@given(
    batch=st.lists(
        st.tuples(rows, rows, st.integers(0, 3), st.integers(0, 3), st.integers(0, 3)),
        min_size=1,
        max_size=5,
    )
)
def test_every_row_of_a_padded_batch_matches_a_brute_force_scan(batch: list[Any]) -> None:
    golden = [_pad(g, left, right) for g, _, left, right, _ in batch]
    target = [_pad(t, left, extra) for _, t, left, _, extra in batch]
    result = first_divergent_token(golden, target, pad_id=PAD)
    assert isinstance(result, tuple)
    assert len(result) == len(batch)
    for i, (d, (g, t, *_)) in enumerate(zip(result, batch, strict=True)):
        assert d.row == i
        assert (d.position, d.golden_token, d.target_token) == _brute(g, t)
        if d.golden_column is not None:
            assert golden[i][d.golden_column] == d.golden_token


def test_tensors_and_arrays_work_like_lists() -> None:
    golden = torch.tensor([[0, 0, 5, 6, 7], [0, 4, 5, 6, 7]])
    target = golden.clone()
    target[1, 3] = 9
    rows = first_divergent_token(golden, target.numpy(), pad_id=0)
    assert [r.position for r in rows] == [None, 2]
    assert (rows[1].golden_token, rows[1].target_token, rows[1].golden_column) == (6, 9, 3)


def test_batch_shapes_must_match() -> None:
    with pytest.raises(PrecisionInputError, match="same requests"):
        first_divergent_token([[1, 2], [3]], [[1, 2]])
    with pytest.raises(PrecisionInputError, match="integers"):
        first_divergent_token([1, 2.5], [1, 2])


def _logprobs(*rows: dict[int, float], vocab: int = 8) -> torch.Tensor:
    """One distribution per step: the given tokens' probabilities, the rest shared evenly."""
    out = []
    for row in rows:
        rest = (1 - sum(row.values())) / (vocab - len(row))
        probs = [row.get(i, rest) for i in range(vocab)]
        out.append([math.log(p) for p in probs])
    return torch.tensor(out, dtype=torch.float64)


def test_a_near_tie_at_the_divergence_is_accepted_and_later_tokens_are_not_compared() -> None:
    golden = [1, 2, 3, 4]
    target = [1, 2, 5, 6]  # parts at position 2, then follows its own prefix
    g = _logprobs({1: 0.9}, {2: 0.9}, {3: 0.41, 5: 0.40}, {4: 0.9})
    t = _logprobs({1: 0.9}, {2: 0.9}, {5: 0.41, 3: 0.40}, {6: 0.9})
    result = assert_tokens_close(golden, target, golden_logprobs=g, target_logprobs=t)
    (row,) = result.rows
    assert row.status == "near-tie"
    assert row.passed
    assert row.divergence.position == 2
    assert row.golden_logprob == pytest.approx(math.log(0.41))
    assert row.target_logprob_of_golden == pytest.approx(math.log(0.40))
    assert row.compared_logprobs == 2


def test_a_real_divergence_reports_tokens_logprobs_and_both_top_k_lists() -> None:
    golden, target = [1, 2, 3], [1, 2, 7]
    g = _logprobs({1: 0.9}, {2: 0.9}, {3: 0.8, 7: 0.01})
    t = _logprobs({1: 0.9}, {2: 0.9}, {7: 0.8, 3: 0.01})
    words = {1: "The", 2: " cat", 3: " sat", 7: " flew"}
    with pytest.raises(TokensDiverged) as failure:
        assert_tokens_close(
            golden,
            target,
            golden_logprobs=g,
            target_logprobs=t,
            top_k=3,
            decode=lambda ids: "".join(words.get(i, f"<{i}>") for i in ids),
        )
    message = str(failure.value)
    assert "tokens diverge at position 2: golden 3 ' sat' vs target 7 ' flew'" in message
    assert "after: 'The cat'" in message
    assert "golden top-3: 3 ' sat' -0.2231" in message
    assert "target top-3: 7 ' flew' -0.2231" in message
    assert f"{math.log(0.01):.4f}" in message
    assert failure.value.result.rows[0].status == "diverged"


def test_without_logprobs_any_divergence_fails() -> None:
    with pytest.raises(TokensDiverged, match="no logprobs to judge a tie"):
        assert_tokens_close([1, 2, 3], [1, 2, 4])
    with pytest.raises(TokensDiverged, match="target ended"):
        assert_tokens_close([1, 2, 3], [1, 2])


def test_right_token_wrong_probability_fails() -> None:
    g = _logprobs({1: 0.9}, {2: 0.9})
    t = _logprobs({1: 0.9}, {2: 0.5})
    result = compare_tokens([1, 2], [1, 2], golden_logprobs=g, target_logprobs=t)
    (row,) = result.rows
    assert row.status == "logprobs"
    assert not result.passed
    (mismatch,) = row.logprob_mismatches
    assert mismatch.position == 1
    assert mismatch.gap == pytest.approx(math.log(0.9 / 0.5))
    # a looser tolerance accepts it
    assert compare_tokens(
        [1, 2], [1, 2], golden_logprobs=g, target_logprobs=t, logprob_tol=1.0
    ).passed


def test_logprobs_align_with_the_last_ids_and_logits_are_normalized() -> None:
    prompt_and_answer = [[9, 9, 1, 2]]  # two prompt ids, two generated ones
    logits = [torch.tensor([[5.0, 1.0, 9.0, 0.0]]), torch.tensor([[0.0, 0.0, 9.0, 3.0]])]
    logits[0][0, 1] = 9.0  # step 0 chose token 1
    result = compare_tokens(
        prompt_and_answer, prompt_and_answer, golden_logprobs=logits, target_logprobs=logits
    )
    assert result.rows[0].compared_logprobs == 2
    assert result.passed
    with pytest.raises(PrecisionInputError, match="3 steps of logprobs for 2 ids"):
        compare_tokens([1, 2], [1, 2], golden_logprobs=torch.zeros(3, 4))
