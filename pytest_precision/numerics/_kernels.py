"""Fused CPU kernels (numba) for the float64 metrics and statistics passes.

The torch pipeline in :mod:`._metrics` makes some twenty memory passes over float64 buffers per
chunk; these kernels read each element once and keep every sum, maximum and count in registers.
They are an optional accelerator: without numba (the ``fast`` extra) or off the CPU, the torch
pipeline runs, and the tests hold both to the same float64 numpy oracle.

Kernels are serial and release the GIL; :func:`run_chunks` spreads chunks over a thread pool as
wide as ``torch.get_num_threads()``. Only float32 and float64 are compiled: narrower floats are
widened to float32 (exactly) chunk by chunk, so extra memory stays a few chunk buffers.
"""

from __future__ import annotations

import functools
import importlib.metadata
import itertools
import math
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Generic, TypeVar

import numpy as np
import torch

from . import _chunks
from ._kernel_layout import (
    ABS_ERR,
    ACC_SIZE,
    LOC_ABS,
    LOC_REL,
    LOC_ULP,
    MAX_ABS,
    MAX_REL,
    MAX_ULP,
    RULE_SLOTS,
    RULES_START,
    SUMS,
)

#: Set to ``0`` to use the torch pipeline even where numba is installed.
ENV_SWITCH = "PYTEST_PRECISION_KERNELS"

#: Elements per block inside a call: the unit of the finiteness check and of max locations.
BLOCK_NUMEL = 4096
#: Below this much work (elements times their relative cost) the work stays on the calling
#: thread: handing a range to another thread costs tens of microseconds.
PARALLEL_NUMEL = 1 << 21
#: Work per element of a comparison, relative to statistics (measured: about 4x).
COMPARE_COST = 4

_KERNEL_DTYPES: dict[torch.dtype, type[np.floating[Any]]] = {
    torch.float32: np.float32,
    torch.float64: np.float64,
}
#: Dtypes the kernels take after a chunk-wise exact widening to float32.
_WIDENED_DTYPES = {torch.float16, torch.bfloat16} | {
    getattr(torch, name)
    for name in ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz")
    if hasattr(torch, name)
}


@functools.cache
def _numba_version() -> str | None:
    try:
        return importlib.metadata.version("numba")
    except importlib.metadata.PackageNotFoundError:
        return None


def _switched_off_by() -> str | None:
    """The setting that turns the kernels off, if any: :data:`ENV_SWITCH`, or numba's own
    ``NUMBA_DISABLE_JIT``, under which the kernels would run as Python (and their intrinsics
    cannot run at all)."""
    if os.environ.get(ENV_SWITCH, "1") == "0":
        return f"{ENV_SWITCH}=0"
    numba_off = os.environ.get("NUMBA_DISABLE_JIT", "").strip()
    if numba_off not in ("", "0"):
        return f"NUMBA_DISABLE_JIT={numba_off}"
    return None


def enabled() -> bool:
    """Whether the kernels are installed and not switched off."""
    return _numba_version() is not None and _switched_off_by() is None


def describe() -> str:
    """One line for report headers: which implementation computes the CPU metrics."""
    version = _numba_version()
    if version is None:
        return "torch (install pytest-precision[fast] for the numba kernels)"
    switch = _switched_off_by()
    if switch is not None:
        return f"torch ({switch}; numba {version} installed)"
    return f"numba {version} kernels"


@functools.cache
def _jit() -> Any:
    """The compiled kernels, imported on first use (numba takes a while to import)."""
    from . import _numba_kernels

    return _numba_kernels


def accepts(*tensors: torch.Tensor) -> bool:
    """True if the kernels can take these tensors: CPU floats the kernels know."""
    return enabled() and all(
        t.device.type == "cpu" and (t.dtype in _KERNEL_DTYPES or t.dtype in _WIDENED_DTYPES)
        for t in tensors
    )


def accepts_bits(t: torch.Tensor) -> bool:
    """True if the kernels can sum ``t``, a tensor's bit patterns as integers: on CPU."""
    return enabled() and t.device.type == "cpu"


# --------------------------------------------------------------------------------------------
# Chunks as numpy arrays, widened where needed, spread over threads
# --------------------------------------------------------------------------------------------

_local = threading.local()


def _kernel_arrays(
    flats: Sequence[torch.Tensor], start: int, stop: int
) -> Iterator[tuple[int, list[np.ndarray]]]:
    """Elements ``start:stop`` of flat tensors as numpy arrays the kernels take, with their
    offset: one view each when all are float32/64; else chunks, narrower floats copied
    (exactly) into float32 buffers reused per thread."""
    if all(flat.dtype in _KERNEL_DTYPES for flat in flats):
        yield start, [flat[start:stop].numpy() for flat in flats]
        return
    buffers: dict[int, torch.Tensor] = _local.__dict__.setdefault("buffers", {})
    for lo in range(start, stop, _chunks.CHUNK_NUMEL):
        hi = min(lo + _chunks.CHUNK_NUMEL, stop)
        arrays = []
        for slot, flat in enumerate(flats):
            chunk = flat[lo:hi]
            if chunk.dtype in _KERNEL_DTYPES:
                arrays.append(chunk.numpy())
                continue
            buffer = buffers.get(slot)
            if buffer is None or buffer.numel() < chunk.numel():
                buffer = buffers[slot] = torch.empty(max(chunk.numel(), _chunks.CHUNK_NUMEL))
            arrays.append(buffer[: chunk.numel()].copy_(chunk).numpy())
        yield lo, arrays


_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()
_pool_pid = 0
_pool_width = 0


def _threads(width: int) -> ThreadPoolExecutor:
    """A worker pool at least ``width`` threads wide, rebuilt after a fork (a forked child
    inherits no threads) and when torch's thread count grew (a narrower pool would queue
    ranges); a replaced pool's threads exit once its last user lets go of it."""
    global _pool, _pool_pid, _pool_width
    with _pool_lock:
        if _pool is None or _pool_pid != os.getpid() or _pool_width < width:
            _pool_width = max(width, torch.get_num_threads() - 1)
            _pool = ThreadPoolExecutor(max_workers=_pool_width, thread_name_prefix="precision")
            _pool_pid = os.getpid()
        return _pool


T = TypeVar("T")


def run_chunks(numel: int, work: Callable[[int, int], T], *, cost: int = 1) -> list[T]:
    """Call ``work(start, stop)`` on contiguous chunk-aligned ranges covering ``numel``
    elements, one range per thread (the partition, and so every result, depends only on the
    thread count), and return the results in range order."""
    workers = max(min(torch.get_num_threads(), -(-numel // _chunks.CHUNK_NUMEL)), 1)
    if numel * cost < PARALLEL_NUMEL or workers == 1:
        return [work(0, numel)]
    chunks = -(-numel // _chunks.CHUNK_NUMEL)
    bounds = [min(numel, (chunks * i // workers) * _chunks.CHUNK_NUMEL) for i in range(workers + 1)]
    ranges = _SharedRanges([(lo, hi) for lo, hi in itertools.pairwise(bounds) if hi > lo], work)
    pool = _threads(len(ranges.ranges) - 1)
    for _ in ranges.ranges[1:]:
        pool.submit(ranges.drain)
    ranges.drain()  # the calling thread takes ranges too
    return ranges.results()


class _SharedRanges(Generic[T]):
    """Ranges taken in order by whichever thread asks first. The calling thread goes on
    taking them, so it never waits for a pool thread that has not started yet (on a loaded
    machine that wait is a scheduling delay on every call: 5 of 10 s comparing 500 pairs of
    1M elements), only for ranges already running; a pool thread that starts late finds
    none left. Who runs a range changes no result."""

    def __init__(self, ranges: list[tuple[int, int]], work: Callable[[int, int], T]) -> None:
        self.ranges = ranges
        self._work: Callable[[int, int], T] | None = work
        self._taken = 0
        self._finished = 0
        self._done = threading.Condition()
        self._results: dict[int, T] = {}
        self._errors: dict[int, BaseException] = {}

    def drain(self) -> None:
        """Run ranges until none is left to take."""
        while True:
            with self._done:
                index, work = self._taken, self._work
                if index == len(self.ranges) or work is None:
                    return
                self._taken += 1
            try:
                self._results[index] = work(*self.ranges[index])
            except BaseException as exc:  # raised again by results(), in the calling thread
                self._errors[index] = exc
            with self._done:
                self._finished += 1
                self._done.notify_all()

    def results(self) -> list[T]:
        """Every range's result in range order, once all have finished; the first range's
        error, if any failed."""
        with self._done:
            self._done.wait_for(lambda: self._finished == len(self.ranges))
            # a pool thread that starts late still holds this object: not the work and the
            # tensors it reads (memory-mapped pairs would pile up while it waits its turn)
            self._work = None
        if self._errors:
            raise self._errors[min(self._errors)]
        results, self._results = self._results, {}
        return [results[i] for i in range(len(self.ranges))]


# --------------------------------------------------------------------------------------------
# Drivers
# --------------------------------------------------------------------------------------------


class CompareTotals:
    """What the comparison kernel accumulated over a range of elements."""

    def __init__(self) -> None:
        self.acc = np.zeros(ACC_SIZE)
        self.acc[[MAX_ABS, MAX_REL, MAX_ULP]] = -1.0  # no finite element seen yet
        self.counts = np.zeros(RULES_START + RULE_SLOTS, dtype=np.int64)
        self.locs = np.full(3, -1, dtype=np.int64)

    def merge(self, later: CompareTotals) -> None:
        """Fold in the totals of a later range (earlier ranges win ties of the maxima)."""
        self.acc[SUMS] += later.acc[SUMS]
        self.counts += later.counts
        for slot, loc in ((MAX_ABS, LOC_ABS), (MAX_REL, LOC_REL), (MAX_ULP, LOC_ULP)):
            if later.acc[slot] > self.acc[slot]:
                self.acc[slot] = later.acc[slot]
                self.locs[loc] = later.locs[loc]


def fits(limits: int, small_value: float) -> bool:
    """Whether the comparison kernel can evaluate a rule: at most :data:`RULE_SLOTS` limits,
    and a small value whose inverse is exact and finite (zero or a power of two from 2 ** -1023
    up, as in every table), so that the floored error is a multiplication."""
    exact_inverse = math.frexp(small_value)[0] == 0.5 and math.isfinite(1.0 / small_value)
    return limits <= RULE_SLOTS and (small_value == 0.0 or exact_inverse)


def compare(
    flat_a: torch.Tensor,
    flat_e: torch.Tensor,
    *,
    ulp_offset: int,
    min_ulp_bits: int,
    limits: Sequence[tuple[int, float]],
    small_value: float,
    rtol: float,
) -> CompareTotals:
    """Run the comparison kernel over two flat CPU tensors of the same length; ``limits``
    are (quantity code, limit) pairs, and the rule must :func:`fit <fits>`."""
    if not fits(len(limits), small_value):
        raise ValueError(f"the kernels cannot take {len(limits)} limits, small {small_value}")
    padding = [(ABS_ERR, math.inf)] * (RULE_SLOTS - len(limits))
    kinds = np.array([kind for kind, _ in [*limits, *padding]], dtype=np.int64)
    bounds = np.array([limit for _, limit in [*limits, *padding]], dtype=np.float64)
    ulp = np.array([ulp_offset, min_ulp_bits], dtype=np.int64)
    inverse = 1.0 / small_value if small_value else math.inf  # never used when 0
    params = np.array([small_value, rtol, inverse])
    kernels = _jit()

    def work(start: int, stop: int) -> CompareTotals:
        totals = CompareTotals()
        for lo, (a, e) in _kernel_arrays((flat_a, flat_e), start, stop):
            kernels._compare_chunk(
                a,
                e,
                BLOCK_NUMEL,
                ulp,
                params,
                kinds,
                bounds,
                totals.acc,
                totals.counts,
                totals.locs,
                lo,
            )
        return totals

    parts = run_chunks(flat_a.numel(), work, cost=COMPARE_COST)
    for later in parts[1:]:
        parts[0].merge(later)
    return parts[0]


def first_at(
    flat_a: torch.Tensor,
    flat_e: torch.Tensor,
    block: int,
    *,
    column: int,
    best: float,
    ulp_offset: int,
    min_ulp_bits: int,
) -> int | None:
    """The first flat index in the block starting at ``block`` (as :func:`compare` located
    it), among elements finite on both sides, whose absolute (``column`` 0) or relative (1)
    error is ``best``; with ``best`` 0, the first such element. None if there is none."""
    ulp = np.array([ulp_offset, min_ulp_bits], dtype=np.int64)
    stop = min(block + BLOCK_NUMEL, flat_a.numel())
    for lo, (a, e) in _kernel_arrays((flat_a, flat_e), block, stop):
        found = _jit()._first_at(a, e, ulp, column, best)
        if found >= 0:
            return lo + found
    return None
