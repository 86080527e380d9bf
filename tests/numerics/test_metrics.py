"""Metrics agree with a direct float64 numpy computation, whatever the dtype and chunking."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from pytest_precision import tensor_stats
from pytest_precision.numerics._details import error_details
from pytest_precision.numerics._dtypes import FLOAT_FORMATS
from pytest_precision.numerics._measure import measure

#: Every test runs on the torch pipeline and on the numba kernels.
pytestmark = pytest.mark.usefixtures("metrics_backend")

FLOAT_DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]


def reference_metrics(a: np.ndarray, e: np.ndarray, dtype: torch.dtype) -> dict[str, float]:
    """The textbook definitions, in float64 numpy, on finite inputs."""
    a, e = a.astype(np.float64).ravel(), e.astype(np.float64).ravel()
    d = np.abs(a - e)
    ea = np.abs(e)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        rel = np.where(ea > 0, d / ea, np.where(d == 0, 0.0, np.inf))
    bits, emin = FLOAT_FORMATS[dtype]
    exponent = np.floor(np.log2(np.where(ea > 0, ea, 1.0)))
    exponent = np.where(ea > 0, np.maximum(exponent, emin), emin)
    ulp = np.exp2(np.maximum(exponent - (bits - 1), -1022))
    with np.errstate(over="ignore"):
        ulp_err = d / ulp
    aa, ee = float(a @ a), float(e @ e)
    if aa == 0 or ee == 0:
        cosine = 1.0 if aa == ee else 0.0
    else:
        cosine = max(-1.0, min(1.0, float(a @ e) / (math.sqrt(aa) * math.sqrt(ee))))
    dd = float(d @ d)
    n = a.size
    return {
        "cosine": cosine,
        "max_abs_err": float(d.max()),
        "max_abs_flat": int(d.argmax()),
        "max_rel_err": float(rel.max()),
        "max_rel_flat": int(rel.argmax()),
        "mean_abs_err": float(d.sum()) / n,
        "mean_rel_err": float(rel.sum()) / n,
        "rmse": math.sqrt(dd / n),
        "sqnr_db": math.inf
        if dd == 0
        else (-math.inf if ee / dd == 0 else 10 * math.log10(ee / dd)),
        "thousandth_ratio": float((rel <= 1e-3).mean()),
        "five_thousandth_ratio": float((rel <= 5e-3).mean()),
        "max_ulp": float(ulp_err.max()),
        "mean_ulp": float(ulp_err.sum()) / n,
    }


#: Bounded metrics near 0 are judged absolutely: the cosine of orthogonal vectors, and SQNR in dB
#: when signal and noise are alike (a log of a ratio near 1).
ABSOLUTE = {"cosine": 1e-12, "sqnr_db": 1e-12}


def assert_agrees(ours: float, theirs: float, what: str) -> None:
    if math.isinf(theirs) or math.isnan(theirs):
        assert ours == theirs or (math.isnan(ours) and math.isnan(theirs)), what
    else:
        assert ours == pytest.approx(theirs, rel=1e-12, abs=ABSOLUTE.get(what, 1e-300)), what


def _finite_pairs(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor, torch.dtype]:
    dtype = draw(st.sampled_from(FLOAT_DTYPES))
    n = draw(st.integers(1, 300))
    limit = 6e4 if dtype == torch.float16 else 1e30
    values = hnp.arrays(
        np.float64, n, elements=st.floats(-limit, limit, allow_nan=False, allow_infinity=False)
    )
    expected = torch.from_numpy(draw(values)).to(dtype)
    if draw(st.booleans()):
        noise = torch.from_numpy(draw(hnp.arrays(np.float64, n, elements=st.floats(-1e-2, 1e-2))))
        actual = (expected.double() * (1 + noise)).to(dtype)
    else:
        actual = torch.from_numpy(draw(values)).to(dtype)
    return actual, expected, dtype


finite_pairs = st.composite(_finite_pairs)


_TINY = 6.87e-82  # its squares' product underflows into the subnormals


@settings(max_examples=200, deadline=None)
@given(finite_pairs(), st.sampled_from([None, 1, 7, 64]))
@example(
    (
        torch.tensor([0.0, _TINY, _TINY, _TINY], dtype=torch.float64),
        torch.tensor([_TINY] * 4, dtype=torch.float64),
        torch.float64,
    ),
    None,
)
def test_metrics_match_float64_numpy(
    pair: tuple[torch.Tensor, torch.Tensor, torch.dtype], chunk: int | None
) -> None:
    actual, expected, dtype = pair
    m = measure(actual, expected, chunk_numel=chunk)
    ref = reference_metrics(actual.double().numpy(), expected.double().numpy(), dtype)
    for name in (
        "cosine",
        "max_abs_err",
        "max_rel_err",
        "mean_abs_err",
        "mean_rel_err",
        "rmse",
        "sqnr_db",
        "thousandth_ratio",
        "five_thousandth_ratio",
        "max_ulp",
        "mean_ulp",
    ):
        assert_agrees(getattr(m, name), ref[name], name)
    assert m.max_abs_index == (ref["max_abs_flat"],)
    assert m.max_rel_index == (ref["max_rel_flat"],)
    assert m.numel == m.finite_count == actual.numel()


def test_bfloat16_values_are_read_exactly() -> None:
    # Neighbouring bf16 values: the errors are exact in float64 but would round to 0 or to
    # another value if they were accumulated in bf16.
    expected = torch.tensor([1.9921875, 255.0, 1024.0], dtype=torch.bfloat16)
    actual = torch.tensor([2.0, 254.0, 1032.0], dtype=torch.bfloat16)
    m = measure(actual, expected)
    assert m.max_abs_err == 8.0
    assert m.mean_abs_err == (0.0078125 + 1.0 + 8.0) / 3
    assert m.max_ulp == 1.0
    assert m.sqnr_db == 10 * math.log10(
        (1.9921875**2 + 255.0**2 + 1024.0**2) / (0.0078125**2 + 1 + 64)
    )


def test_index_is_in_the_tensors_shape() -> None:
    expected = torch.zeros(3, 4, 5)
    actual = expected.clone()
    actual[2, 1, 3] = 1.0
    m = measure(actual, expected, chunk_numel=8)
    assert m.max_abs_index == (2, 1, 3)
    assert m.max_abs_err == 1.0


def test_strided_input_is_read_in_logical_order() -> None:
    base = torch.randn(6, 8, generator=torch.Generator().manual_seed(0))
    actual, expected = base.t(), base.t().contiguous().clone()
    expected[5, 2] += 1.0
    assert measure(actual, expected, chunk_numel=5).max_abs_index == (5, 2)


def test_empty_and_zero_dim() -> None:
    empty = measure(torch.empty(0, 3), torch.empty(0, 3))
    assert empty.numel == 0
    assert empty.max_abs_index is None
    assert empty.cosine == 1.0
    scalar = measure(torch.tensor(2.0), torch.tensor(1.0))
    assert scalar.max_abs_index == ()
    assert scalar.max_rel_err == 1.0


def test_zero_expected_gives_zero_or_infinite_relative_error() -> None:
    m = measure(torch.tensor([0.0, 1.0, 0.0]), torch.tensor([0.0, 1.0, 1e-3]))
    assert m.max_rel_err == 1.0
    m = measure(torch.tensor([1e-3, 1.0]), torch.tensor([0.0, 1.0]))
    assert m.max_rel_err == math.inf
    assert m.max_rel_index == (0,)


def test_non_finite_values_are_counted_and_left_out() -> None:
    nan, inf = math.nan, math.inf
    actual = torch.tensor([nan, inf, -inf, 1.0, nan, 2.0])
    expected = torch.tensor([nan, inf, inf, 1.5, 0.0, 2.0])
    m = measure(actual, expected, chunk_numel=4)
    assert (m.actual_nonfinite.nan, m.actual_nonfinite.posinf, m.actual_nonfinite.neginf) == (
        2,
        1,
        1,
    )
    assert (m.expected_nonfinite.nan, m.expected_nonfinite.posinf) == (1, 2)
    assert m.nonfinite_mismatch_count == 2  # -inf vs inf, nan vs 0
    assert not m.nonfinite_positions_agree
    assert m.finite_count == 2
    assert m.max_abs_err == 0.5
    assert m.max_abs_index == (3,)
    assert m.mean_abs_err == 0.25


def test_integer_pairs_use_float64_without_overflow() -> None:
    m = measure(torch.tensor([2**62, 5]), torch.tensor([2**62, 7]))
    assert m.max_abs_err == 2.0


def test_statistics_match_numpy() -> None:
    t = torch.randn(1000, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    t[10] = math.nan
    t[11] = math.inf
    stats = tensor_stats(t)
    finite = t.double().numpy()
    finite = finite[np.isfinite(finite)]
    assert stats.nan_count == 1
    assert stats.posinf_count == 1
    assert stats.max == finite.max()
    assert stats.min == finite.min()
    assert stats.mean == pytest.approx(finite.mean(), rel=1e-12)
    assert stats.norm == pytest.approx(np.linalg.norm(finite), rel=1e-12)


def test_error_details_locate_and_bucket() -> None:
    from pytest_precision.numerics._standards import AllClose

    expected = torch.ones(100)
    actual = expected.clone()
    actual[[3, 50]] = torch.tensor([1.5, 1.001])
    rule = AllClose().rule(torch.float32)
    details = error_details(actual, expected, rule, rtol=1.3e-6, atol=1e-5, k=3)
    assert [el.index for el in details.first_mismatches] == [(3,), (50,)]
    assert details.worst[0].index == (3,)
    assert details.worst[0].abs_err == 0.5
    assert details.required_atol == pytest.approx(0.5 - 1.3e-6)
    assert details.required_rtol == pytest.approx(0.5 - 1e-5)
    assert sum(details.histogram) == 100
    assert details.histogram[0] == 98


def test_identical_float64_has_cosine_exactly_one() -> None:
    t = torch.randn(1000, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    assert measure(t, t.clone()).cosine == 1.0


def test_cosine_of_overflowing_float64_is_nan_not_one() -> None:
    m = measure(
        torch.tensor([1e300, 1e300], dtype=torch.float64),
        torch.tensor([1e300, -1e300], dtype=torch.float64),
    )
    assert math.isnan(m.cosine)


def test_max_index_skips_non_finite_positions() -> None:
    m = measure(torch.tensor([math.nan, 2.0, 3.0]), torch.tensor([math.nan, 2.0, 3.5]))
    assert m.max_abs_index == (2,)
    equal = measure(torch.tensor([math.nan, 2.0]), torch.tensor([math.nan, 2.0]))
    assert equal.max_abs_index == (1,)


def test_float8_statistics_and_metrics() -> None:
    t = torch.linspace(-2, 2, 9).to(torch.float8_e5m2)
    assert tensor_stats(t).max == 2.0
    assert measure(t, t).max_abs_err == 0.0


def test_error_details_with_non_finite_mismatch() -> None:
    from pytest_precision.numerics._standards import AllClose

    actual = torch.ones(10)
    actual[:2] = torch.tensor([math.nan, math.inf])
    rule = AllClose().rule(torch.float32)
    details = error_details(actual, torch.ones(10), rule, rtol=1.3e-6, atol=1e-5)
    assert details.required_atol == math.inf
    assert sum(details.histogram) == 8  # finite pairs only
    assert [el.index for el in details.first_mismatches] == [(0,), (1,)]
