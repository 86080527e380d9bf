"""The statistics pass gives the same bits however a tensor is laid out or shared between
threads: strided tensors gathered piece by piece sum like their contiguous copy, and blocks
shared between threads add up like one thread's."""

from __future__ import annotations

import math
import threading

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from pytest_precision import tensor_stats
from pytest_precision.numerics import _chunks, _kernels, _stats_pass

needs_numba = pytest.mark.skipif(not _kernels.enabled(), reason="numba is not installed")

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]
SPECIAL = st.sampled_from([0.0, -0.0, math.inf, -math.inf, math.nan, 1e30, -3.5])
#: Magnitudes far apart: float64 sums of them round, so a change of order changes their bits.
VALUES = st.one_of(st.floats(-1e3, 1e3), st.floats(-1e17, 1e17), st.floats(-1e-6, 1e-6), SPECIAL)


def _bits(t: torch.Tensor) -> list[str]:
    """The statistics as exact text: float64 bits, signs of zero and NaN included."""
    return [repr(v) for v in tensor_stats(t).to_dict().values()]


def _tiny(mp: pytest.MonkeyPatch, *, shared_from: int) -> None:
    """Blocks of 4 and pieces of 16 elements, so small tensors cross every boundary."""
    mp.setenv(_kernels.ENV_SWITCH, "1")
    mp.setattr(_kernels, "BLOCK_NUMEL", 4)
    mp.setattr(_chunks, "CHUNK_NUMEL", 16)
    mp.setattr(_kernels, "PARALLEL_NUMEL", 1 << 30)
    mp.setattr(_stats_pass, "PARALLEL_STATS_NUMEL", shared_from)


@st.composite
def strided(draw: st.DrawFn) -> torch.Tensor:
    """A view of a random tensor of 2 to 4 dimensions: transposed, sliced with a step, narrowed
    or broadcast. (A 1-d strided float32 / float64 tensor is read in place by the kernel
    compiled for strided arrays, as it always was, which may round otherwise.)"""
    dtype = draw(st.sampled_from(DTYPES))
    shape = draw(st.lists(st.integers(1, 7), min_size=2, max_size=4))
    values = draw(hnp.arrays(np.float64, shape, elements=VALUES))
    t = torch.from_numpy(values).to(dtype)
    view = draw(st.sampled_from(["transpose", "step", "narrow", "expand", "flip-dims"]))
    if view == "transpose" and t.dim() >= 2:
        return t.transpose(0, -1)
    if view == "step":
        return t[..., ::2]
    if view == "narrow" and t.shape[-1] > 1:
        return t[..., 1:]
    if view == "expand":
        return t.unsqueeze(0).expand(3, *t.shape)
    return t.permute(*reversed(range(t.dim())))


@needs_numba
@settings(max_examples=200, deadline=None)
@given(strided(), st.sampled_from([1 << 30, 8]))
def test_a_strided_tensor_sums_like_its_contiguous_copy(t: torch.Tensor, shared: int) -> None:
    with pytest.MonkeyPatch.context() as mp:
        _tiny(mp, shared_from=shared)
        assert _bits(t) == _bits(t.contiguous())


def _wide(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """float64 values from 1e-3 to 1e17 in size, either sign: almost any change in the order
    of their sums changes the bits of the result."""
    generator = torch.Generator().manual_seed(seed)
    exponents = torch.rand(shape, generator=generator, dtype=torch.float64) * 20 - 3
    signs = torch.randint(0, 2, shape, generator=generator) * 2 - 1
    return signs * 10**exponents


@needs_numba
@pytest.mark.parametrize("block", [4096, 4])
def test_strided_views_of_wide_values_sum_like_their_contiguous_copy(
    monkeypatch: pytest.MonkeyPatch, block: int
) -> None:
    monkeypatch.setenv(_kernels.ENV_SWITCH, "1")
    monkeypatch.setattr(_kernels, "BLOCK_NUMEL", block)
    t = _wide((6, 37, 53), seed=block)
    views = [t.transpose(0, 2), t[:, 1:, 2:], t[:, :, ::2], t.permute(1, 0, 2), t[::2, ::3]]
    for view in views:
        assert not view.is_contiguous()
        assert _bits(view) == _bits(view.contiguous()), view.stride()


@needs_numba
@settings(max_examples=150, deadline=None)
@given(
    st.sampled_from(DTYPES),
    hnp.arrays(np.float64, st.integers(0, 300), elements=VALUES),
    st.integers(2, 5),
)
def test_blocks_shared_between_threads_add_up_like_one_threads(
    dtype: torch.dtype, values: np.ndarray, threads: int
) -> None:
    t = torch.from_numpy(values).to(dtype)
    pairs = torch.stack([t, torch.zeros_like(t)], dim=1)
    column = pairs[:, :1]  # t's elements, gathered (2-d, strides (2, 1))
    flat = pairs[:, 0]  # t's elements, 1-d with stride 2: read in place
    before = torch.get_num_threads()
    try:
        with pytest.MonkeyPatch.context() as mp:
            _tiny(mp, shared_from=1 << 30)
            alone, flat_alone = _bits(t), _bits(flat)
            torch.set_num_threads(threads)
            mp.setattr(_stats_pass, "PARALLEL_STATS_NUMEL", 8)
            assert _bits(t) == alone
            assert _bits(column) == alone  # gathered, then shared
            assert _bits(flat) == flat_alone
    finally:
        torch.set_num_threads(before)


@needs_numba
def test_the_shared_pass_does_share(monkeypatch: pytest.MonkeyPatch) -> None:
    """It runs the kernel on several threads (else the test above compares nothing)."""
    _tiny(monkeypatch, shared_from=8)
    seen: set[int] = set()
    run = _stats_pass._run

    def noting(*args: object, **kwargs: object) -> None:
        seen.add(threading.get_ident())
        run(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(_stats_pass, "_run", noting)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        tensor_stats(torch.randn(200))
    finally:
        torch.set_num_threads(before)
    assert len(seen) == 2


@needs_numba
def test_a_bfloat16_tensor_is_read_in_place(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel widens each bfloat16 as it reads it (a float32's upper half): no buffer of
    widened values is filled first, and the statistics are the torch pipeline's."""
    t = torch.randn(3000).bfloat16()
    t[5], t[7], t[11] = math.nan, -math.inf, -0.0
    monkeypatch.setenv(_kernels.ENV_SWITCH, "0")
    expected = _bits(t)
    monkeypatch.setenv(_kernels.ENV_SWITCH, "1")

    def no_buffer(*args: object) -> torch.Tensor:
        raise AssertionError("widened into a buffer")

    monkeypatch.setattr(_stats_pass, "_buffer", no_buffer)
    assert _bits(t) == expected
    with pytest.raises(AssertionError, match="widened"):  # a strided one is gathered first
        _bits(t[::2])
