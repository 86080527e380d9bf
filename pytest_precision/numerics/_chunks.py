"""Reading a tensor in flat chunks: the unit of every float64 pass, so that extra memory stays
bounded whatever the tensor's size."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import torch

#: Elements per chunk: large enough to amortize per-op dispatch, small enough to stay in cache.
CHUNK_NUMEL = 1 << 18

#: Per-thread float64 work buffers, by device, reused across chunks and calls.
scratch = threading.local()


def flatten_detached(t: torch.Tensor) -> torch.Tensor:
    """``t`` as a flat, detached tensor: a view when contiguous, else one copy in its own dtype."""
    return t.detach().reshape(-1)


def chunk_of(flat: torch.Tensor, start: int, chunk_numel: int) -> torch.Tensor:
    """Elements ``start:start + chunk_numel`` of a flat tensor, widened if kernels need it."""
    chunk = flat[start : start + chunk_numel]
    # One-byte floats (float8 formats) lack most kernels (isfinite, aminmax, ==): float32 holds
    # them exactly.
    return chunk.float() if chunk.is_floating_point() and chunk.element_size() == 1 else chunk


def iter_flat_chunks(t: torch.Tensor, chunk_numel: int = CHUNK_NUMEL) -> Iterator[torch.Tensor]:
    """Yield consecutive 1-d chunks of ``t`` (see :func:`flatten_detached`, :func:`chunk_of`)."""
    flat = flatten_detached(t)
    for start in range(0, flat.numel(), chunk_numel):
        yield chunk_of(flat, start, chunk_numel)


def ravel_index(index: tuple[int, ...], shape: tuple[int, ...]) -> int:
    """The flat position of ``index`` in a C-contiguous tensor of ``shape``."""
    flat = 0
    for i, size in zip(index, shape, strict=True):
        flat = flat * size + i
    return flat


def unravel_index(flat_index: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The index of flat position ``flat_index`` in a C-contiguous tensor of ``shape``."""
    index = []
    for size in reversed(shape):
        flat_index, rem = divmod(flat_index, size)
        index.append(rem)
    return tuple(reversed(index))
