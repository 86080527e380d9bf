"""Per-tensor statistics and error metrics, always accumulated in float64.

Tensors are read in flat chunks so that the extra memory stays bounded whatever their size, and
every computation runs on the device where the tensor lives.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

import torch

#: Elements per chunk: large enough to amortize per-op dispatch, small enough to stay in cache.
CHUNK_NUMEL = 1 << 18


def iter_flat_chunks(t: torch.Tensor, chunk_numel: int = CHUNK_NUMEL) -> Iterator[torch.Tensor]:
    """Yield consecutive 1-d views of ``t`` (a contiguous copy is made only for strided input)."""
    flat = t.reshape(-1)
    for start in range(0, flat.numel(), chunk_numel):
        yield flat[start : start + chunk_numel]


@dataclass(frozen=True)
class TensorStats:
    """Summary statistics of one tensor, as stored in dumps.

    ``max``, ``min``, ``mean`` and ``norm`` (L2) cover the finite elements only; non-finite ones
    are counted separately. Complex tensors are summarized over their real and imaginary parts.
    All four are ``nan`` when no element is finite.
    """

    max: float
    min: float
    mean: float
    norm: float
    nan_count: int
    posinf_count: int
    neginf_count: int
    numel: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TensorStats:
        return cls(**{name: data[name] for name in cls.__dataclass_fields__})


_scratch = threading.local()


def _float64_copy(chunk: torch.Tensor) -> torch.Tensor:
    """``chunk`` in float64, in a buffer reused per thread and device: allocating a fresh one
    for every chunk costs as much as the sums themselves."""
    buffers: dict[torch.device, torch.Tensor] = _scratch.__dict__.setdefault("buffers", {})
    buffer = buffers.get(chunk.device)
    if buffer is None or buffer.numel() < chunk.numel():
        buffer = torch.empty(
            max(chunk.numel(), CHUNK_NUMEL), dtype=torch.float64, device=chunk.device
        )
        buffers[chunk.device] = buffer
    return buffer[: chunk.numel()].copy_(chunk)


def _with_reduction_kernels(chunk: torch.Tensor) -> torch.Tensor:
    """``chunk`` in a dtype torch can reduce, exactly: float8 as float32, uint16/32 as int64."""
    if chunk.is_floating_point() and chunk.element_size() == 1:
        return chunk.to(torch.float32)
    if chunk.dtype in (torch.uint16, torch.uint32):
        return chunk.to(torch.int64)
    if chunk.dtype == torch.uint64:
        return chunk.to(torch.float64)  # exact below 2**53
    return chunk


def tensor_stats(t: torch.Tensor) -> TensorStats:
    """Compute :class:`TensorStats` of ``t`` with float64 accumulation, chunk by chunk."""
    if t.is_complex():
        t = torch.view_as_real(t)
    if t.dtype == torch.bool:
        t = t.to(torch.uint8)
    numel = t.numel()
    total = 0.0
    sq_total = 0.0
    lo = math.inf
    hi = -math.inf
    nan = posinf = neginf = 0
    floating = t.is_floating_point()
    for chunk in iter_flat_chunks(t.detach()):
        chunk = _with_reduction_kernels(chunk)
        c64 = _float64_copy(chunk)
        c_total = float(c64.sum())
        # A float64 sum of finite values is finite unless float64 itself overflows, so the
        # costly element-wise finiteness test only runs on chunks whose sum is not.
        if floating and not math.isfinite(c_total):
            finite = torch.isfinite(chunk)
            nan += int(torch.isnan(chunk).sum())
            posinf += int((chunk == math.inf).sum())
            neginf += int((chunk == -math.inf).sum())
            chunk = chunk[finite]
            if chunk.numel() == 0:
                continue
            c64 = _float64_copy(chunk)
            c_total = float(c64.sum())
        # min and max are exact in the source dtype; only the sums need float64.
        c_lo, c_hi = torch.aminmax(chunk)
        lo = min(lo, float(c_lo))
        hi = max(hi, float(c_hi))
        total += c_total
        sq_total += float(torch.dot(c64, c64))
    finite_count = numel - nan - posinf - neginf
    if finite_count == 0:
        return TensorStats(math.nan, math.nan, math.nan, math.nan, nan, posinf, neginf, numel)
    return TensorStats(
        max=hi,
        min=lo,
        mean=total / finite_count,
        norm=math.sqrt(sq_total),
        nan_count=nan,
        posinf_count=posinf,
        neginf_count=neginf,
        numel=numel,
    )
