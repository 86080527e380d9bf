"""The precision_checker standard: mindformers' rule reproduced, and its scale blind spot fixed."""

from __future__ import annotations

import math

import pytest
import torch

from pytest_precision import PrecisionChecker, PrecisionInputError, compare_tensors
from pytest_precision.numerics._comparison import resolve_standard
from pytest_precision.numerics._precision_checker import magnitude_sums
from pytest_precision.numerics._standard_names import STANDARDS

ORIGINAL = PrecisionChecker(two_sided=False)
GEN = torch.Generator().manual_seed(12)


def _expected() -> torch.Tensor:
    """The same 64 x 64 unit normals in every test (the figures in docs/standards.md)."""
    return torch.randn(64, 64, generator=torch.Generator().manual_seed(12))


def test_registered_by_name() -> None:
    assert STANDARDS["precision_checker"] is PrecisionChecker
    assert isinstance(resolve_standard("precision_checker", torch.float32), PrecisionChecker)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_scale_090_passes_the_original_rule_and_fails_the_two_sided_one(dtype: torch.dtype) -> None:
    e = 0.5 * _expected()
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
    # KL sees a scale c of normal values of std s only through the softmax's sharpness:
    # s^2 (1 - c)^2 / 2, 0.00125 here, the limit 0.005 at s = 1, nothing for small values
    assert fixed.standard.sums.kl == pytest.approx(0.00125, rel=0.2)
    small = compare_tensors(0.009 * e, 0.01 * e, standard=ORIGINAL)
    assert small.verdict == "pass"
    assert small.standard.sums.kl < 1e-5  # type: ignore[attr-defined]


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


@pytest.mark.parametrize("corrupt", ["sign flip", "zeroed"])
def test_a_few_wrong_elements_pass_both_rules_but_not_the_ratio_guard(corrupt: str) -> None:
    """A few corrupted elements that leave the three sums almost unchanged pass the rule,
    original and two-sided alike; the ratio standard's max-element guard catches them."""
    e = _expected()
    a = e.clone()
    flat = a.view(-1)
    if corrupt == "sign flip":
        i = int(torch.argmin((flat.abs() - 0.5).abs()))  # an element of magnitude ~0.5
        flat[i] = -flat[i]
    else:
        flat[:4] = 0.0  # softmax never reaches 0, so KL stays small (2.5e-5)
    for standard in (ORIGINAL, PrecisionChecker()):
        assert compare_tensors(a, e, standard=standard).verdict == "pass"
    assert compare_tensors(a, e, standard="ratio").verdict == "fail"


def test_large_corruptions_fail_cosine_and_kl() -> None:
    e = _expected()
    a = e.clone()
    a.view(-1)[:4] *= 10
    result = compare_tensors(a, e, standard="precision_checker")
    assert result.verdict == "fail"
    assert "fails cosine:" in result.reason  # KL 0.0043: a few x10 barely move the softmax
    peaked = e.clone()
    peaked.view(-1)[:4] = 10.0  # the softmax of the target piles onto four elements
    result = compare_tensors(peaked, e, standard="precision_checker")
    assert result.verdict == "fail"
    assert "kl 2.65" in result.reason
    assert "FAILS < 0.005" in result.reason


def test_sums_match_a_direct_float64_computation_across_chunks() -> None:
    e = torch.randn(1000, generator=GEN, dtype=torch.float64)
    a = (e * (1 + 0.01 * torch.randn(1000, generator=GEN, dtype=torch.float64))).float()
    sums = magnitude_sums(a, e.float(), chunk_numel=97)
    a64, e64 = a.double(), e.float().double()
    assert sums.actual_l1 == pytest.approx(float(a64.abs().sum()), rel=1e-12)
    assert sums.expected_l1 == pytest.approx(float(e64.abs().sum()), rel=1e-12)
    log_p, log_q = torch.log_softmax(e64, 0), torch.log_softmax(a64, 0)
    assert sums.kl == pytest.approx(float((log_p.exp() * (log_p - log_q)).sum()), rel=1e-9)


def test_the_streamed_softmax_survives_values_far_beyond_exp_range() -> None:
    """The running maximum keeps exp() finite: values of 1e4 (exp overflows float64 at 710)
    in a late chunk, after small ones, rescale what came before."""
    e = torch.cat([torch.zeros(500, dtype=torch.float64), torch.tensor([1e4, 1e4 - 1.0])])
    a = e.clone()
    a[-1] = 1e4 - 2.0
    sums = magnitude_sums(a, e, chunk_numel=97)
    log_p, log_q = torch.log_softmax(e, 0), torch.log_softmax(a, 0)
    expected = float((log_p.exp() * (log_p - log_q)).sum())
    assert math.isfinite(sums.kl)
    assert sums.kl == pytest.approx(expected, rel=1e-9)


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
