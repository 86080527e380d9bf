"""A weight cast once to a narrower dtype (numerics/_cast_stats.py): its statistics are those
of one rounding per element, whatever the weights' shape and distribution, while one wrong
element among thousands, below the bf16 standard's tolerance, is not."""

from __future__ import annotations

import math

import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from pytest_precision.numerics._cast_stats import narrows, not_one_cast
from pytest_precision.numerics._stats import TensorStats, tensor_stats

SHAPES = st.sampled_from([(7,), (32,), (64, 32), (128, 64), (4096,), (96, 1024), (3, 5, 17)])
DISTRIBUTIONS = (
    "normal",
    "uniform",
    "heavy tails",
    "outliers",
    "sparse",
    "one value",
    "near one value",
    "near one",
    "already narrow",
)
#: a table of a few values repeated (Mamba's ``A_log``): its roundings do not average out
REPEATED = "repeated table"


def _weights(seed: int, shape: tuple[int, ...], kind: str, scale: float) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g, dtype=torch.float64)
    if kind == "uniform":
        x = torch.rand(shape, generator=g, dtype=torch.float64) * 2 - 1
    elif kind == "heavy tails":  # Student's t with 2 degrees of freedom
        x = x / torch.sqrt(torch.randn(shape, generator=g, dtype=torch.float64) ** 2 + 1e-3)
    elif kind == "outliers":
        x.view(-1)[:: max(x.numel() // 5, 1)] *= 80
    elif kind == "sparse":
        x = x * (torch.rand(shape, generator=g, dtype=torch.float64) < 0.1)
    elif kind == "one value":
        x = torch.full(shape, 1 / 3, dtype=torch.float64)
    elif kind == "near one value":  # within a few ULPs of bf16: rounded mostly alike
        x = 1.002 + 1e-4 * x
    elif kind == "near one":  # a trained norm's weights
        x = 1 + 0.05 * x
    elif kind == REPEATED:
        n = math.prod(shape)
        x = torch.log(torch.arange(1, 17, dtype=torch.float64)).repeat(n // 16 + 1)[:n]
        x = x.reshape(shape)
    x = (x * scale).float()
    if kind == "already narrow":  # a golden upcast from a bf16 checkpoint
        x = x.bfloat16().float()
    return x


def _msprobe_stats(t: torch.Tensor) -> TensorStats:
    """As msprobe computes them: torch's reductions in the tensor's own dtype."""
    return TensorStats(
        max=t.max().item(),
        min=t.min().item(),
        mean=t.mean().item(),
        norm=torch.norm(t).item(),
        nan_count=0,
        posinf_count=0,
        neginf_count=0,
        numel=t.numel(),
    )


def _why_not(
    golden: torch.Tensor, target: torch.Tensor, *, msprobe: bool, distinct: bool = True
) -> str | None:
    if msprobe:
        g, t = _msprobe_stats(golden), _msprobe_stats(target)
        g_dtype, t_dtype = golden.dtype, target.dtype
    else:  # native dumps: statistics in float64
        g, t = tensor_stats(golden), tensor_stats(target)
        g_dtype = t_dtype = torch.float64
    return not_one_cast(
        g,
        t,
        golden.dtype,
        target.dtype,
        golden_stats_dtype=g_dtype,
        target_stats_dtype=t_dtype,
        distinct=distinct,
    )


@settings(max_examples=150, deadline=None)
@given(
    st.integers(0, 2**31),
    SHAPES,
    st.sampled_from([*DISTRIBUTIONS, REPEATED]),
    st.floats(1e-3, 30.0),
    st.sampled_from([torch.bfloat16, torch.float16]),
    st.booleans(),
)
# torch's float16 norm of 98,304 equal values is off by 1.2 (0.9e-4): its running sums
@example(0, (96, 1024), "one value", 13.4921875, torch.float16, True)
def test_a_clean_cast_is_one_rounding(
    seed: int,
    shape: tuple[int, ...],
    kind: str,
    scale: float,
    dtype: torch.dtype,
    msprobe: bool,
) -> None:
    """Values of a matrix taken as distinct; a repeated table held to the deterministic bound
    (rounding each element by at most ``u |x_i|``)."""
    golden = _weights(seed, shape, kind, scale)
    distinct = kind != REPEATED
    assert _why_not(golden, golden.to(dtype), msprobe=msprobe, distinct=distinct) is None


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31), st.booleans())
def test_one_wrong_element_below_the_bf16_tolerance_is_no_cast(seed: int, msprobe: bool) -> None:
    """+0.5 on one of 2048 weights of RMS 0.1: the mean moves 2.4e-4, the standard's bf16
    tolerance is 7.8e-3 of it."""
    golden = _weights(seed, (32, 64), "normal", 0.1)
    wrong = golden.clone()
    wrong.view(-1)[int(golden.argmin())] += 0.5  # most often, max and min stay what they were
    assert _why_not(golden, wrong.bfloat16(), msprobe=msprobe) is not None


def test_a_moved_extreme_is_no_cast() -> None:
    golden = _weights(0, (64, 32), "normal", 0.1)
    wrong = golden.clone()
    wrong.view(-1)[int(golden.argmax())] *= 1.05
    reason = _why_not(golden, wrong.bfloat16(), msprobe=True)
    assert reason is not None
    assert reason.startswith("max ")


def test_only_a_narrowing_cast_is_judged() -> None:
    assert narrows(torch.float32, torch.bfloat16)
    assert narrows(torch.float64, torch.float32)
    assert not narrows(torch.bfloat16, torch.float16)  # float16 has a smaller range
    assert not narrows(torch.float32, torch.float32)
    assert not narrows(torch.bfloat16, torch.float32)
    golden = _weights(1, (64,), "normal", 1.0)
    assert _why_not(golden, golden.double(), msprobe=True) is None


def test_a_repeated_table_is_no_matrix_of_distinct_values() -> None:
    """Mamba's ``A_log`` (``log(1..16)`` in each of 128 rows) rounds every copy of a value
    alike: taken for distinct values, its clean fp16 cast would be convicted (statistics in
    float64, as native dumps compute them)."""
    golden = _weights(0, (128, 16), REPEATED, 1.0)
    assert _why_not(golden, golden.half(), msprobe=False, distinct=True) is not None
    assert _why_not(golden, golden.half(), msprobe=False, distinct=False) is None
