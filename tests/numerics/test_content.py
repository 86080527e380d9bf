"""A tensor's content sum is the same whichever read computes it: the statistics pass (numba
kernels or torch pipeline, contiguous or gathered, shared between threads or not), the private
copy, or a sum of its own; and it is the sum of the components' bit patterns."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from pytest_precision import tensor_stats
from pytest_precision.numerics import _chunks, _kernels, _stats_pass
from pytest_precision.numerics._content import (
    content_sum,
    copy_with_content,
    tensor_stats_and_content,
)

DTYPES = [
    torch.float32,
    torch.float64,
    torch.bfloat16,
    torch.float16,
    torch.float8_e4m3fn,
    torch.complex64,
    torch.complex128,
    torch.int32,
    torch.uint8,
    torch.bool,
]
#: Numpy integers of each component size.
_NP_INTS = {1: np.int8, 2: np.int16, 4: np.int32, 8: np.int64}


def _expected(t: torch.Tensor) -> int:
    """The definition: the components' bit patterns as signed integers, summed exactly, then
    wrapped to 32 bits (components up to 4 bytes) or 64 (8 bytes)."""
    if t.is_complex():
        t = torch.view_as_real(t)
    size = t.element_size()
    ints = (
        torch.empty(t.shape, dtype=t.dtype).copy_(t).view(torch.uint8).numpy().view(_NP_INTS[size])
    )
    total = sum(int(v) for v in ints.reshape(-1))
    bits = 32 if size <= 4 else 64
    return (total + (1 << (bits - 1))) % (1 << bits) - (1 << (bits - 1))


@st.composite
def tensors(draw: st.DrawFn) -> torch.Tensor:
    dtype = draw(st.sampled_from(DTYPES))
    shape = draw(st.lists(st.integers(1, 9), min_size=1, max_size=3))
    values = draw(hnp.arrays(np.float64, shape, elements=st.floats(-3e4, 3e4)))
    t = torch.from_numpy(values)
    t = (t > 0) if dtype == torch.bool else t.to(dtype)
    view = draw(st.sampled_from(["contiguous", "transpose", "step", "expand", "empty"]))
    if view == "transpose" and t.dim() >= 2:
        return t.transpose(0, -1)
    if view == "expand":
        return t.unsqueeze(1).expand(t.shape[0], 3, *t.shape[1:])
    if view == "empty":
        return t.unsqueeze(-1).expand(*t.shape, 2)[..., :0]
    if view == "step":
        return t[..., ::2]
    return t


@pytest.mark.parametrize("kernels", ["numba", "torch"])
@settings(max_examples=60, deadline=None)
@given(t=tensors(), shared=st.booleans())
def test_every_read_gives_the_content_sum(kernels: str, t: torch.Tensor, shared: bool) -> None:
    if kernels == "numba" and not _kernels.enabled():
        pytest.skip("numba is not installed")
    before = torch.get_num_threads()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(_kernels.ENV_SWITCH, "1" if kernels == "numba" else "0")
        # blocks of 4, pieces of 16, shared between 2 threads: small tensors cross boundaries
        mp.setattr(_kernels, "BLOCK_NUMEL", 4)
        mp.setattr(_chunks, "CHUNK_NUMEL", 16)
        mp.setattr(_kernels, "PARALLEL_NUMEL", 32 if shared else 1 << 30)
        mp.setattr(_stats_pass, "PARALLEL_STATS_NUMEL", 8 if shared else 1 << 30)
        try:
            torch.set_num_threads(2)
            expected = _expected(t)
            assert content_sum(t) == expected
            stats, content = tensor_stats_and_content(t)
            assert content == expected
            # summing the bits changes no statistic (the kernel's loop is compiled without it)
            assert repr(stats) == repr(tensor_stats(t))
            assert torch.equal(copy_with_content(t, content=False)[0], t)
            copy, content = copy_with_content(t)
            assert content == expected
            assert torch.equal(copy, t)
            assert copy.is_contiguous()
        finally:
            torch.set_num_threads(before)


def test_overflowing_sums_wrap_the_same_way_on_every_path(monkeypatch: pytest.MonkeyPatch) -> None:
    t = torch.full((1 << 12,), -1.5e38)  # bit patterns near -2**31: the sum leaves int32
    expected = _expected(t)
    assert content_sum(t) == tensor_stats_and_content(t)[1] == expected
    monkeypatch.setenv(_kernels.ENV_SWITCH, "0")
    assert content_sum(t) == tensor_stats_and_content(t)[1] == expected


def test_a_conjugate_view_has_no_content_sum() -> None:
    z = torch.randn(4, dtype=torch.complex64).conj()
    assert content_sum(z) is None
    assert tensor_stats_and_content(z)[1] is None
    copy, content = copy_with_content(z)
    assert content is None
    assert torch.equal(copy, z.resolve_conj())


def test_a_permuted_view_is_summed_over_its_memory_as_it_lies(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The content sum adds in any order: a transposed view is summed over the run of memory
    it fills, by the kernels, not gathered by torch's strided sum (three times slower)."""
    if not _kernels.enabled():
        pytest.skip("numba is not installed")
    t = torch.randn(4, 6, 8).permute(2, 0, 1)
    expected = _expected(t)

    def no_gather(self: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        raise AssertionError("gathered by torch")

    monkeypatch.setattr(torch.Tensor, "sum", no_gather)
    assert content_sum(t) == expected
    with pytest.raises(AssertionError, match="gathered"):  # a strided slice fills no run
        content_sum(t[::2])


def test_a_copy_takes_the_content_sum_of_the_tensor_not_of_the_copy() -> None:
    """A bool tensor over bytes other than 0 and 1 (a view of other data) is copied as 0 and
    1: the fingerprint must be what a later check of the tensor itself computes."""
    raw = torch.tensor([2, 3, 255, 1] * 8, dtype=torch.uint8)
    t = raw.view(torch.bool).reshape(4, 8)
    expected = int(raw.view(torch.int8).to(torch.int64).sum())
    assert content_sum(t) == expected
    assert copy_with_content(t)[1] == expected
