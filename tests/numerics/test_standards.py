"""The standards' verdicts: the bars users rely on, and agreement with torch.testing."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from pytest_precision import (
    AllClose,
    PrecisionInputError,
    Ratio,
    RatioTier,
    Reference,
    Ulp,
    compare_tensors,
    default_standard,
)
from pytest_precision.numerics._comparison import judge_pair, rounding_envelope
from pytest_precision.numerics._standards import ALLCLOSE_TOLERANCES

#: Every test runs on the torch pipeline and on the numba kernels.
pytestmark = pytest.mark.usefixtures("metrics_backend")

GEN = torch.Generator().manual_seed(1234)


def randn(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=GEN)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_rounding_from_fp32_passes_under_the_low_precision_standard(dtype: torch.dtype) -> None:
    original = randn(1000, 100)
    result = compare_tensors(original.to(dtype), original)
    assert result.verdict == "pass", result.reason
    assert result.dtype == dtype


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
def test_one_percent_scale_error_fails(dtype: torch.dtype) -> None:
    expected = randn(1000, 100)
    result = compare_tensors((expected * 1.01).to(dtype), expected.to(dtype))
    assert result.verdict == "fail", result.reason


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
def test_one_element_off_by_10x_in_a_million_fails(dtype: torch.dtype) -> None:
    expected = randn(1_000_000).to(dtype)
    actual = expected.clone()
    actual[123_457] = expected[123_457] * 10
    result = compare_tensors(actual, expected)
    assert result.verdict == "fail", result.reason
    assert result.mismatch_count == 1
    assert result.max_abs_index == (123_457,)


@pytest.mark.parametrize("standard", ["ratio", "allclose", "ulp"])
def test_nan_where_expected_is_finite_fails(standard: str) -> None:
    expected = randn(100)
    actual = expected.clone()
    actual[7] = math.nan
    result = compare_tensors(actual, expected, standard=standard)
    assert result.verdict == "fail"
    assert "non-finite" in result.reason


def test_matching_nan_positions_pass() -> None:
    expected = randn(100)
    expected[3] = math.nan
    assert compare_tensors(expected.clone(), expected).verdict == "pass"


def test_warn_tier() -> None:
    expected = randn(10_000).abs() + 1
    actual = expected.clone()
    actual[:50] *= 1.009  # 0.5 % of elements between the bf16 pass (2**-7) and warn (1e-2) tiers
    result = compare_tensors(actual.bfloat16(), expected)
    assert result.verdict == "warn", result.reason


def test_small_value_rule_judges_tiny_expected_absolutely() -> None:
    expected = torch.full((1000,), 1e-10)
    actual = expected + 5e-11  # 50 % relative, but far below float32's small value 2**-20
    assert compare_tensors(actual, expected).verdict == "pass"
    assert compare_tensors(actual, expected, standard="allclose").verdict == "pass"  # atol


def test_a_zero_small_value_judges_every_element_relatively() -> None:
    # A pair of zeros has floored error 0 / max(0, 0): it must read as 0 (as the relative
    # error does), not as a NaN that hides the other elements' errors from the counts.
    plain = RatioTier(1e-4, 0.9999, 1e-3, 0.999, 1e-2, small_value=0.0)
    result = compare_tensors(
        torch.tensor([0.0, 1.0, 1.0]),
        torch.tensor([0.0, 2.0, 0.0]),
        standard=Ratio(tiers={torch.float32: plain}),
    )
    assert result.rule_counts == (2, 2, 2)
    assert result.verdict == "fail"


def test_default_standards() -> None:
    assert isinstance(default_standard(torch.bfloat16), Ratio)
    assert default_standard(torch.int64).name == "exact"
    assert default_standard(torch.bool).name == "exact"


def test_integers_compare_exactly_beyond_float64_precision() -> None:
    result = compare_tensors(torch.tensor([2**62 + 1]), torch.tensor([2**62]))
    assert result.verdict == "fail"
    assert result.standard.name == "exact"


def test_explicit_tolerances_select_allclose() -> None:
    expected = randn(100)
    actual = expected * 1.001
    assert compare_tensors(actual, expected, rtol=1e-2, atol=0).verdict == "pass"
    result = compare_tensors(actual, expected, rtol=1e-4)
    assert isinstance(result.standard, AllClose)
    assert result.standard.tolerances(torch.float32) == (1e-4, 1e-5)
    assert result.verdict == "fail"


def test_bad_standard_arguments() -> None:
    t = randn(3)
    with pytest.raises(PrecisionInputError, match="unknown standard 'cosine'"):
        compare_tensors(t, t, standard="cosine")
    with pytest.raises(PrecisionInputError, match="allclose standard only"):
        compare_tensors(t, t, standard="ratio", rtol=1e-3)
    with pytest.raises(PrecisionInputError, match="needs reference="):
        compare_tensors(t, t, standard="reference")
    with pytest.raises(PrecisionInputError, match="no limits for dtype"):
        compare_tensors(t.to(torch.float8_e4m3fn), t.to(torch.float8_e4m3fn), standard="ratio")


def test_tables_are_overridable() -> None:
    expected = randn(1000)
    actual = expected * 1.002
    strict = compare_tensors(actual, expected)
    loose = Ratio(tiers={torch.float32: Ratio().tier(torch.bfloat16)})
    assert strict.verdict == "fail"
    assert compare_tensors(actual, expected, standard=loose).verdict == "pass"


def test_reference_standard() -> None:
    a, b = randn(64, 64), randn(64, 64)
    reference = a.double() @ b.double()
    baseline = (a @ b).double()  # fp32 matmul
    good = (a.half().float() @ b.half().float()).double()  # inputs rounded to fp16: much worse
    same = compare_tensors(baseline.clone(), baseline, reference=reference, standard="reference")
    assert same.verdict == "pass", same.reason
    bad = compare_tensors(good, baseline, reference=reference, standard=Reference("matmul"))
    assert bad.verdict == "fail", bad.reason
    assert bad.actual_vs_reference is not None
    assert bad.actual_vs_reference.max_abs_err > bad.expected_vs_reference.max_abs_err


def test_ulp_standard() -> None:
    expected = randn(1000)
    nudged = torch.nextafter(expected, torch.full_like(expected, math.inf))
    assert compare_tensors(nudged, expected, standard="ulp").verdict == "pass"
    half = expected.half()
    assert compare_tensors(half, expected, standard=Ulp()).verdict == "pass"
    assert compare_tensors(expected * 1.01, expected, standard="ulp").verdict == "fail"


_DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]


@st.composite
def close_pairs(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor]:
    dtype = draw(st.sampled_from(_DTYPES))
    n = draw(st.integers(1, 50))
    rtol, atol = ALLCLOSE_TOLERANCES[dtype]
    expected = draw(hnp.arrays(np.float64, n, elements=st.floats(-100, 100)))
    scale = draw(st.sampled_from([0.1, 0.5, 1.0, 2.0, 10.0]))
    noise = draw(hnp.arrays(np.float64, n, elements=st.floats(-1, 1)))
    e = torch.from_numpy(expected).to(dtype)
    a = (e.double() + torch.from_numpy(noise) * scale * (atol + rtol * e.double().abs())).to(dtype)
    return a, e


@settings(max_examples=300, deadline=None)
@given(close_pairs())
def test_allclose_agrees_with_torch_testing(pair: tuple[torch.Tensor, torch.Tensor]) -> None:
    actual, expected = pair
    rtol, atol = ALLCLOSE_TOLERANCES[expected.dtype]
    # Deliberate difference: we decide in float64, torch.testing in the tensors' dtype, so the
    # two may disagree for an element within one rounding of the boundary. Skip those.
    d = (actual.double() - expected.double()).abs()
    bound = atol + rtol * expected.double().abs()
    eps = torch.finfo(expected.dtype).eps
    assume(bool(((d - bound).abs() > 4 * eps * bound).all()))
    try:
        torch.testing.assert_close(actual, expected)
        theirs = True
    except AssertionError:
        theirs = False
    ours = compare_tensors(actual, expected, standard="allclose").verdict == "pass"
    assert ours == theirs


def test_integers_stay_exact_with_bare_tolerances() -> None:
    result = compare_tensors(torch.tensor([100]), torch.tensor([101]), rtol=0.5)
    assert result.standard.name == "exact"
    assert result.verdict == "fail"


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_float8_is_compared(dtype: torch.dtype) -> None:
    expected = torch.linspace(-4, 4, 64)
    result = compare_tensors(expected.to(dtype), expected)
    assert result.dtype == dtype
    assert result.standard.name == "allclose"  # no ratio tiers for float8
    assert compare_tensors(expected.to(dtype), expected.to(dtype), standard="exact").passed


def test_reference_standard_fails_nan_where_the_reference_is_finite() -> None:
    t = randn(16)
    bad = t.clone()
    bad[3] = math.nan
    result = compare_tensors(bad, bad.clone(), reference=t.double(), standard="reference")
    assert result.verdict == "fail"
    assert "float64 reference differs" in result.reason


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_rounding_envelope_takes_one_rounding_and_refuses_a_scale_error(
    dtype: torch.dtype,
) -> None:
    exact = torch.randn(4096, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    exact[:16] = 1e-6  # cancelled sums: judged against the output's RMS, not themselves
    rounded = (exact + 1e-3 * exact.abs().mean()).to(dtype) if dtype == torch.bfloat16 else None
    envelope = rounding_envelope(exact, dtype)
    assert judge_pair(exact.to(dtype), exact, envelope, dtype).verdict == "pass"
    assert judge_pair((exact * 1.05).to(dtype), exact, envelope, dtype).verdict == "fail"
    if rounded is not None:  # an absolute error of 1e-3 RMS on every element is within bf16's
        assert judge_pair(rounded, exact, envelope, dtype).verdict == "pass"
