"""The precision_checker standard: mindformers' rule reproduced, and its scale blind spot fixed."""

from __future__ import annotations

import math

import pytest
import torch

from pytest_precision import PrecisionChecker, PrecisionInputError, compare_tensors
from pytest_precision.numerics._comparison import resolve_standard
from pytest_precision.numerics._precision_checker import magnitude_sums
from pytest_precision.numerics._standards import STANDARDS

ORIGINAL = PrecisionChecker(two_sided=False)
GEN = torch.Generator().manual_seed(12)


def _expected() -> torch.Tensor:
    return torch.randn(64, 64, generator=GEN)


def test_registered_by_name() -> None:
    assert STANDARDS["precision_checker"] is PrecisionChecker
    assert isinstance(resolve_standard("precision_checker", torch.float32), PrecisionChecker)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_scale_090_passes_the_original_rule_and_fails_the_two_sided_one(dtype: torch.dtype) -> None:
    e = _expected()
    actual = (0.90 * e).to(dtype)
    original = compare_tensors(actual, e, standard=ORIGINAL)
    assert original.verdict == "pass", original.reason  # the blind spot, reproduced
    assert original.cosine > 0.9999
    fixed = compare_tensors(actual, e, standard="precision_checker")
    assert fixed.verdict == "fail"
    assert "fails l1_ratio" in fixed.reason
    assert isinstance(fixed.standard, PrecisionChecker)
    assert fixed.standard.sums is not None
    assert fixed.standard.sums.l1_ratio == pytest.approx(0.90, abs=1e-3)
    assert fixed.standard.sums.kl < 1e-5  # cosine and KL do not see a common scale


def test_scale_110_fails_both() -> None:
    e = _expected()
    for standard in (ORIGINAL, PrecisionChecker()):
        assert compare_tensors(1.10 * e, e, standard=standard).verdict == "fail"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_honest_rounding_passes(dtype: torch.dtype) -> None:
    e = _expected()
    result = compare_tensors(e.to(dtype), e, standard="precision_checker")
    assert result.verdict == "pass", result.reason
    assert result.standard.sums is not None  # type: ignore[attr-defined]
    assert abs(result.standard.sums.l1_ratio - 1) < 1e-3  # type: ignore[attr-defined]


def test_identical_tensors() -> None:
    e = _expected()
    result = compare_tensors(e.clone(), e, standard="precision_checker")
    assert result.verdict == "pass"
    assert result.standard.sums.kl == 0.0  # type: ignore[attr-defined]


def test_one_small_sign_flip_passes_both_rules_but_not_the_ratio_guard() -> None:
    """A few corrupted elements that leave the three sums almost unchanged pass the rule,
    original and two-sided alike; the ratio standard's max-element guard catches them."""
    e = _expected()
    a = e.clone()
    flat = a.view(-1)
    i = int(torch.argmin((flat.abs() - 0.5).abs()))  # an element of magnitude ~0.5
    flat[i] = -flat[i]
    for standard in (ORIGINAL, PrecisionChecker()):
        assert compare_tensors(a, e, standard=standard).verdict == "pass"
    assert compare_tensors(a, e, standard="ratio").verdict == "fail"


def test_large_corruptions_fail_cosine_and_kl() -> None:
    e = _expected()
    a = e.clone()
    a.view(-1)[:4] *= 10
    result = compare_tensors(a, e, standard="precision_checker")
    assert result.verdict == "fail"
    assert "cosine" in result.reason
    zeroed = e.clone()
    zeroed.view(-1)[:4] = 0  # |a| = 0 where |e| > 0: the KL term is infinite
    result = compare_tensors(zeroed, e, standard="precision_checker")
    assert result.verdict == "fail"
    assert "fails kl" in result.reason


def test_sums_match_a_direct_float64_computation_across_chunks() -> None:
    e = torch.randn(1000, generator=GEN, dtype=torch.float64)
    a = (e * (1 + 0.01 * torch.randn(1000, generator=GEN, dtype=torch.float64))).float()
    sums = magnitude_sums(a, e.float(), chunk_numel=97)
    a64, e64 = a.double().abs(), e.float().double().abs()
    p, q = e64 / e64.sum(), a64 / a64.sum()
    assert sums.actual_l1 == pytest.approx(float(a64.sum()), rel=1e-12)
    assert sums.expected_l1 == pytest.approx(float(e64.sum()), rel=1e-12)
    assert sums.kl == pytest.approx(float((p * (p / q).log()).sum()), rel=1e-9)


def test_non_finite_and_zero_cases() -> None:
    e = torch.tensor([1.0, float("nan"), 2.0])
    assert compare_tensors(e.clone(), e, standard="precision_checker").verdict == "pass"
    a = torch.tensor([1.0, 1.0, 2.0])
    assert compare_tensors(a, e, standard="precision_checker").verdict == "fail"
    zeros = torch.zeros(4)
    assert compare_tensors(zeros, zeros.clone(), standard="precision_checker").verdict == "pass"
    assert compare_tensors(torch.ones(4), zeros, standard="precision_checker").verdict == "fail"
    assert magnitude_sums(torch.ones(4), zeros).l1_ratio == math.inf


def test_unbound_standard_says_how_to_use_it() -> None:
    e = _expected()
    metrics = compare_tensors(e, e, standard="ratio")
    with pytest.raises(PrecisionInputError, match="measures the pair itself"):
        PrecisionChecker().judge(metrics, None)


def test_in_a_dump_comparison_path() -> None:
    """judge_pair binds the standard, so compare_dumps' record comparisons use it too."""
    from pytest_precision.numerics._comparison import judge_pair

    e = _expected()
    result = judge_pair(0.9 * e, e, PrecisionChecker(), torch.float32)
    assert result.verdict == "fail"
