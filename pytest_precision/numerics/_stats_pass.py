"""The statistics pass on the numba kernels: one read of each element, at memory speed.

The kernel sums blocks of ``BLOCK_NUMEL`` elements and adds the block sums in order, so the
float64 sums depend only on where blocks start: every path below hands the kernel pieces that
start on a block boundary, and the results are bitwise those of one kernel call over the
contiguous tensor.

The same read sums the elements' bit patterns as integers: the content sum capture fingerprints
a new tensor with (``_content``), at no read of its own. Narrower floats' are summed from the
gathered bits before widening, while they are in cache.

* Contiguous float32 / float64 / bfloat16 tensors are read in place (a bfloat16 is the upper
  half of a float32: the kernel widens each element as it reads it), and so are 1-d strided
  float32 / float64 ones.
* Other strided float32 / float64 tensors (a transposed view) are gathered block by block, in
  row-major order, into a block-sized buffer (in cache) that the kernel sums: one read of the
  memory, never a copy of the whole tensor. Other narrower floats (float16, float8; a strided
  bfloat16) are gathered by numpy into a buffer of a few hundred KiB reused per thread, and
  widened to float32 there, exactly (bfloat16 by the kernel).
* Tensors from :data:`PARALLEL_STATS_NUMEL` elements are shared between threads. Below
  ``_kernels.PARALLEL_NUMEL`` each thread writes the sums of its blocks to a row per block, added
  up afterwards in block order: the same sums as one thread makes. From there the tensor is cut
  into one range per thread, each summed on its own and the range sums added, as since the
  kernels exist (so the statistics written before stay bitwise the same).
"""

from __future__ import annotations

import itertools
import math
import struct
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from . import _chunks, _kernels

#: From this many elements the pass is shared between threads (about 1 MiB of float32 per
#: thread: less than that, and handing a piece to another thread costs more than it saves).
PARALLEL_STATS_NUMEL = 1 << 19

#: Per kernel dtype: its integer view, the mask that turns its bits into ordered keys, and the
#: struct codes of the integer and of the float.
_BITS = {
    np.float32: (np.int32, np.int32(0x7FFF_FFFF), "i", "f"),
    np.float64: (np.int64, np.int64(0x7FFF_FFFF_FFFF_FFFF), "q", "d"),
}
_INT64 = np.iinfo(np.int64)
#: Signed integers of each element size: how any dtype's bits are gathered with numpy, and
#: summed as its content (``_content``).
SIGNED_BITS = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}

_local = threading.local()

#: (sum, sum of squares, min, max) of the finite elements, (nan, +inf, -inf) counts and the
#: content sum (see :func:`stats`)
Sums = tuple[float, float, float, float, int, int, int, int]


def _from_key(key: int, float_type: type[np.floating[Any]]) -> float:
    _, mask, int_code, float_code = _BITS[float_type]
    bits = key ^ (int(mask) if key < 0 else 0)  # the key transform is its own inverse
    return struct.unpack(float_code, struct.pack(int_code, bits))[0]


def _buffer(name: str, numel: int, dtype: torch.dtype) -> torch.Tensor:
    """A flat work buffer of at least ``numel`` elements, reused by this thread."""
    buffers: dict[tuple[str, torch.dtype], torch.Tensor] = _local.__dict__.setdefault("b", {})
    buffer = buffers.get((name, dtype))
    if buffer is None or buffer.numel() < numel:
        buffer = buffers[name, dtype] = torch.empty(max(numel, _chunks.CHUNK_NUMEL), dtype=dtype)
    return buffer[:numel]


def _gather(a: np.ndarray, lo: int, hi: int, out: np.ndarray) -> None:
    """Elements ``lo:hi`` of ``a`` in row-major order into the flat ``out``: whole rows of the
    first dimension in one copy, partial rows by recursion into them."""
    while lo < hi:
        if a.ndim <= 1:
            out[:] = a.reshape(-1)[lo:hi]
            return
        inner = a[0].size
        row, offset = divmod(lo, inner)
        if offset or hi - lo < inner:
            stop = min(hi, (row + 1) * inner)
            _gather(a[row], offset, stop - row * inner, out[: stop - lo])
        else:
            rows = (hi - lo) // inner
            stop = lo + rows * inner
            np.copyto(out[: stop - lo].reshape(rows, *a.shape[1:]), a[row : row + rows])
        out = out[stop - lo :]
        lo = stop


class _Source:
    """A tensor as the kernel reads it: float32 / float64 elements in row-major order."""

    def __init__(self, t: torch.Tensor, content: bool) -> None:
        self.content = content  # whether the kernel sums the bit patterns too
        if t.requires_grad:
            t = t.detach()
        self.numel = t.numel()
        self.dtype = t.dtype
        self.float_type = _kernels._KERNEL_DTYPES.get(t.dtype, np.float32)
        self.contiguous = t.is_contiguous()
        self.flat: np.ndarray | None = None
        self.raw: np.ndarray | None = None  # its bits as integers: numpy gathers any dtype
        #: a strided float32 / float64 tensor: the span of memory it reads, and its layout
        self.span: np.ndarray | None = None
        self.layout = (np.empty(0, dtype=np.int64),) * 2
        if t.dtype in _kernels._KERNEL_DTYPES and (self.contiguous or t.dim() == 1):
            # A 1-d strided tensor is read in place, by the kernel compiled for strided arrays
            # (as always: its statistics stay bitwise what they were).
            self.flat = t.numpy().reshape(-1)
        elif t.dtype in _kernels._KERNEL_DTYPES and self.numel:
            size = 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True))
            self.span = torch.as_strided(t, (size,), (1,)).numpy()
            self.layout = (np.array(t.shape, dtype=np.int64), np.array(t.stride(), dtype=np.int64))
        else:
            self.raw = t.view(SIGNED_BITS[t.element_size()]).numpy()
            if self.contiguous:
                self.raw = self.raw.reshape(-1)

    def pieces(self, lo: int, hi: int) -> Iterator[tuple[int, np.ndarray, np.ndarray, np.ndarray]]:
        """(offset, elements, their bit patterns for the keys, their own bit patterns) of
        consecutive pieces covering ``lo:hi``, ``lo`` on a block boundary; each piece but the
        last is a whole number of blocks. A bfloat16 piece is its bit patterns, all three: the
        kernel reads them as the float32 values they widen to."""
        if self.flat is not None:
            x = self.flat[lo:hi]
            bits = x.view(_BITS[self.float_type][0])
            yield lo, x, bits, bits
            return
        assert self.raw is not None
        block = _kernels.BLOCK_NUMEL
        step = max(_chunks.CHUNK_NUMEL - _chunks.CHUNK_NUMEL % block, block)
        for start in range(lo, hi, step):
            stop = min(start + step, hi)
            if self.contiguous:
                raw = self.raw[start:stop]
            else:
                raw = _buffer("raw", stop - start, SIGNED_BITS[self.raw.itemsize]).numpy()
                _gather(self.raw, start, stop, raw)
            if self.dtype == torch.bfloat16:
                yield start, raw, raw, raw
                continue
            # widened, exactly; its bit patterns are read again while in cache
            wide = _buffer("wide", stop - start, torch.float32)
            wide.copy_(torch.from_numpy(raw).view(self.dtype))
            yield start, wide.numpy(), wide.view(torch.int32).numpy(), raw


#: The kernel's ``state`` before the first element: min and max keys, NaN, +inf, -inf counts,
#: content sum.
_START = np.array([_INT64.max, _INT64.min, 0, 0, 0, 0], dtype=np.int64)
_NO_BLOCKS = np.empty((0, 2))


class _Totals:
    """What the kernel accumulated over some blocks."""

    def __init__(self, blocks: int = 0) -> None:
        self.acc = np.zeros(2)
        self.state = _START.copy()
        self.block_sums = np.empty((blocks, 2)) if blocks else _NO_BLOCKS

    def merge(self, other: _Totals) -> None:
        """Fold in ``other``'s extremes and counts (the sums are the caller's to add)."""
        self.state[0] = min(self.state[0], other.state[0])
        self.state[1] = max(self.state[1], other.state[1])
        self.state[2:] += other.state[2:]


def _run(source: _Source, lo: int, hi: int, totals: _Totals, first_block: int = 0) -> None:
    """The kernel over elements ``lo:hi``; with ``totals.block_sums``, block ``b`` of the
    tensor writes row ``b - first_block``."""
    kernels = _kernels._jit()
    int_type, mask, _, _ = _BITS[source.float_type]
    block = _kernels.BLOCK_NUMEL
    rows = totals.block_sums

    def rows_of(start: int, count: int) -> np.ndarray:
        if not rows.shape[0]:
            return rows
        first = start // block - first_block
        return rows[first : first - (-count // block)]

    if source.span is not None:
        scratch = _buffer("scratch", block, source.dtype).numpy()
        shape, strides = source.layout
        kernels._stats_strided(source.span, shape, strides, mask, block, lo, hi, totals.acc,
                               totals.state, rows_of(lo, hi - lo), scratch,
                               scratch.view(int_type), source.content)  # fmt: skip
        return
    for start, x, bits, content_bits in source.pieces(lo, hi):
        sums = rows_of(start, x.size)
        kernels._stats_chunk(x, bits, content_bits, mask, block, totals.acc, totals.state, sums,
                             source.content)  # fmt: skip


def _shared(source: _Source, workers: int) -> _Totals:
    """The pass over a tensor of fewer than ``PARALLEL_NUMEL`` elements, its blocks shared
    between ``workers`` threads; the block sums are added in order afterwards."""
    block = _kernels.BLOCK_NUMEL
    blocks = -(-source.numel // block)
    bounds = [blocks * i // workers for i in range(workers + 1)]
    ranges = [(a, b) for a, b in itertools.pairwise(bounds) if b > a]
    parts = [_Totals(b - a) for a, b in ranges]

    def work(i: int) -> None:
        a, b = ranges[i]
        _run(source, a * block, min(b * block, source.numel), parts[i], a)

    pool = _kernels._threads(len(ranges) - 1)
    futures = [pool.submit(work, i) for i in range(1, len(ranges))]
    work(0)
    for future in futures:
        future.result()
    totals = _Totals()
    kernels = _kernels._jit()
    for part in parts:
        kernels._add_block_sums(part.block_sums, totals.acc)
        totals.merge(part)
    return totals


def _ranged(source: _Source) -> _Totals:
    """One range per thread (``_kernels.run_chunks``), each summed alone; range sums added."""

    def work(start: int, stop: int) -> _Totals:
        totals = _Totals()
        _run(source, start, stop, totals)
        return totals

    parts = _kernels.run_chunks(source.numel, work)
    for later in parts[1:]:
        parts[0].acc += later.acc
        parts[0].merge(later)
    return parts[0]


def stats(t: torch.Tensor, content: bool = True) -> Sums:
    """(sum, sum of squares, min, max) of the finite elements, (nan, +inf, -inf) counts and
    the content sum (``_content.content_sum``; 0 without ``content``) of a CPU float tensor
    the kernels accept (any strides); min and max are inf and -inf when no element is
    finite."""
    source = _Source(t, content)
    workers = min(torch.get_num_threads(), -(-source.numel // _kernels.BLOCK_NUMEL))
    if PARALLEL_STATS_NUMEL <= source.numel < _kernels.PARALLEL_NUMEL and workers > 1:
        totals = _shared(source, workers)
    else:
        totals = _ranged(source)
    total, squares = totals.acc.tolist()
    low, high, nan, posinf, neginf, content = totals.state.tolist()
    if low > high:  # no finite element
        return total, squares, math.inf, -math.inf, nan, posinf, neginf, content
    low_value, high_value = _from_key(low, source.float_type), _from_key(high, source.float_type)
    return total, squares, low_value, high_value, nan, posinf, neginf, content
