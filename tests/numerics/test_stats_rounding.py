"""The one-rounding bound of an op's output statistics (numerics/_stats_rounding.py): two
correct implementations of an op, computed in another order, stay within it; a changed formula
(tanh-approximated GELU) does not."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_precision.numerics._stats import TensorStats, tensor_stats
from pytest_precision.numerics._stats_rounding import one_rounding

SHAPES = st.tuples(st.integers(1, 8), st.integers(16, 160))


def _data(seed: int, shape: tuple[int, ...], scale: float) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=generator, dtype=torch.float32) * scale


def _fp32_stats(t: torch.Tensor) -> TensorStats:
    """Statistics as msprobe computes them: reductions in the tensor's own dtype."""
    return TensorStats(
        max=t.max().item(),
        min=t.min().item(),
        mean=t.mean().item(),
        norm=torch.linalg.vector_norm(t).item(),
        nan_count=0,
        posinf_count=0,
        neginf_count=0,
        numel=t.numel(),
    )


def _within(a: torch.Tensor, b: torch.Tensor, **kwargs: object) -> bool:
    golden, target = tensor_stats(a), tensor_stats(b)
    return one_rounding(golden, target, a.dtype, **kwargs).beyond(golden, target) is None  # type: ignore[arg-type]


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**31), SHAPES, st.floats(0.1, 10.0))
def test_an_elementwise_op_rounded_twice_is_within(
    seed: int, shape: tuple[int, int], scale: float
) -> None:
    x = _data(seed, shape, scale)
    fp32 = F.gelu(x)  # torch's fp32 kernel
    rounded = F.gelu(x.double()).float()  # the exact value, rounded once
    assert _within(rounded, fp32)
    assert _within(F.silu(x), (x.double() * torch.sigmoid(x.double())).float())


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**31), SHAPES, st.floats(0.1, 10.0))
def test_one_ulp_per_element_is_within(seed: int, shape: tuple[int, int], scale: float) -> None:
    """Every element moved by one ULP, in random directions or all the same way."""
    y = F.gelu(_data(seed, shape, scale))
    generator = torch.Generator().manual_seed(seed + 1)
    up = torch.rand(shape, generator=generator) < 0.5
    towards = torch.where(up, torch.full_like(y, math.inf), torch.full_like(y, -math.inf))
    assert _within(y, torch.nextafter(y, towards))
    assert _within(y, torch.nextafter(y, torch.full_like(y, math.inf)))


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31), st.integers(1, 6), st.sampled_from([16, 64, 256, 1024]))
def test_a_contraction_summed_in_another_order_is_within(seed: int, rows: int, k: int) -> None:
    """A linear computed whole and as two half-K partial products (split-K), and in float64
    rounded once: another accumulation order. Its terms may cancel; the bound takes their
    magnitude from the inputs' norms."""
    x, w = _data(seed, (rows, k), 1.0), _data(seed + 1, (32, k), 0.1)
    whole = F.linear(x, w)
    half = k // 2
    split = F.linear(x[:, :half], w[:, :half]) + F.linear(x[:, half:], w[:, half:])
    exact = F.linear(x.double(), w.double()).float()
    terms_norm = float(x.norm()) * float(w.norm())
    for a, b in ((whole, split), (whole, exact), (split, exact)):
        assert _within(a, b, terms=k, terms_norm=terms_norm)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31), SHAPES, st.floats(0.5, 20.0))
def test_a_softmax_in_another_order_is_within(
    seed: int, shape: tuple[int, int], scale: float
) -> None:
    """torch's softmax against one written out (max, exp, sum, divide) and the float64 one."""
    x = _data(seed, shape, scale)
    e = torch.exp(x - x.max(-1, keepdim=True).values)
    spelled = e / e.sum(-1, keepdim=True)
    exact = torch.softmax(x.double(), -1).float()
    k = shape[-1]
    assert _within(torch.softmax(x, -1), spelled, terms=k)
    assert _within(torch.softmax(x, -1), exact, terms=k)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31), SHAPES, st.floats(0.1, 10.0))
def test_statistics_summed_in_the_tensors_dtype_are_within(
    seed: int, shape: tuple[int, int], scale: float
) -> None:
    """msprobe sums its statistics in the tensor's dtype: their own rounding is allowed for."""
    x = _data(seed, shape, scale)
    a, b = F.gelu(x), F.gelu(x.double()).float()
    golden, target = _fp32_stats(a), _fp32_stats(b)
    bound = one_rounding(golden, target, torch.float32, stats_dtype=torch.float32)
    assert bound.beyond(golden, target) is None


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**31), st.tuples(st.integers(2, 8), st.integers(64, 256)))
def test_a_gelu_approximation_is_beyond(seed: int, shape: tuple[int, int]) -> None:
    """tanh-approximated GELU against exact GELU, either way: beyond one rounding (the norm
    moves some 1e-5 relative, inside the fp32 standard's 1e-4)."""
    x = _data(seed, shape, 1.0)
    exact, tanh = F.gelu(x), F.gelu(x, approximate="tanh")
    assert not _within(exact, tanh)
    assert not _within(tanh, exact)
    golden, target = tensor_stats(exact), tensor_stats(tanh)
    beyond = one_rounding(golden, target, torch.float32).beyond(golden, target)
    assert beyond is not None
    _, moved, allowed = beyond
    assert moved > 20 * allowed


def test_the_bound_is_one_rounding_of_the_dtype() -> None:
    """An elementwise fp32 op: the norm may move 8 unit roundoffs (two implementations, each
    within one ULP of each element plus the output's RMS), bf16 the same in its own unit
    roundoff; terms and their magnitude widen it."""
    y = tensor_stats(F.gelu(_data(0, (4, 64), 1.0)))
    fp32 = one_rounding(y, y, torch.float32)
    assert fp32.norm == 8 * 2**-24 + 2**-53 * (math.log2(256) + 3)
    assert one_rounding(y, y, torch.bfloat16).norm > 1e4 * fp32.norm
    assert one_rounding(y, y, torch.float32, terms=64).norm > 10 * fp32.norm
    assert one_rounding(y, y, torch.float32, terms_norm=y.norm * 8).norm > fp32.norm
