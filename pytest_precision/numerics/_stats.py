"""Per-tensor statistics (max, min, mean, norm, non-finite counts), accumulated in float64 on the
tensor's own device, or by the fused kernels on CPU."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import torch

from . import _kernels, _stats_pass
from ._chunks import CHUNK_NUMEL, chunk_of, flatten_detached, scratch


@dataclass(frozen=True)
class TensorStats:
    """Summary statistics of one tensor, as stored in dumps.

    ``max``, ``min``, ``mean`` and ``norm`` (L2) cover the finite elements only; non-finite ones
    are counted separately. Complex tensors are summarized over their real and imaginary parts
    (``numel`` still counts complex elements). All four are ``nan`` when no element is finite.
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


def _float64_copy(chunk: torch.Tensor) -> torch.Tensor:
    """``chunk`` in float64, in a buffer reused per thread and device: allocating a fresh one
    for every chunk costs as much as the sums themselves."""
    buffers: dict[torch.device, torch.Tensor] = scratch.__dict__.setdefault("buffers", {})
    buffer = buffers.get(chunk.device)
    if buffer is None or buffer.numel() < chunk.numel():
        buffer = torch.empty(
            max(chunk.numel(), CHUNK_NUMEL), dtype=torch.float64, device=chunk.device
        )
        buffers[chunk.device] = buffer
    return buffer[: chunk.numel()].copy_(chunk)


def with_reduction_kernels(chunk: torch.Tensor) -> torch.Tensor:
    """``chunk`` in a dtype torch can reduce (aminmax, sum), exactly: uint16/32 as int64."""
    if chunk.dtype in (torch.uint16, torch.uint32):
        return chunk.to(torch.int64)
    if chunk.dtype == torch.uint64:
        return chunk.to(torch.float64)  # exact below 2**53
    return chunk


def _positive_zero(value: float) -> float:
    """-0.0 as 0.0: which zero a min or max of zeros returns depends on the implementation
    and the order of the elements, and the statistics a dump stores must not."""
    return 0.0 if value == 0 and isinstance(value, float) else value


def tensor_stats(t: torch.Tensor) -> TensorStats:
    """Compute :class:`TensorStats` of ``t`` with float64 accumulation, chunk by chunk."""
    return stats_with_bit_sum(t, bit_sum=False)[0]


def stats_with_bit_sum(t: torch.Tensor, *, bit_sum: bool = True) -> tuple[TensorStats, int]:
    """:func:`tensor_stats` of ``t`` and, from the same read of its elements, the sum of its
    real components' bit patterns as signed integers, exact modulo 2**32 (``_content``
    reduces it to the content sum). Without ``bit_sum`` neither pipeline sums them (1 - 3 %
    of the kernels' pass) and the second value means nothing."""
    numel = t.numel()  # elements of ``t`` itself, also for complex tensors
    if t.is_complex():
        t = torch.view_as_real(t.resolve_conj().resolve_neg())
    if t.dtype == torch.bool:
        t = t.to(torch.uint8)
    if _kernels.accepts(t):
        total, sq_total, lo, hi, nan, posinf, neginf, bits = _stats_pass.stats(t, bit_sum)
    else:
        total, sq_total, lo, hi, nan, posinf, neginf, bits = _torch_stats(t, bit_sum)
    return from_sums(numel, t.numel(), total, sq_total, lo, hi, nan, posinf, neginf), bits


def from_sums(
    numel: int,
    components: int,
    total: float,
    sq_total: float,
    lo: float,
    hi: float,
    nan: int,
    posinf: int,
    neginf: int,
) -> TensorStats:
    """:class:`TensorStats` of a tensor of ``numel`` elements (``components`` real values: twice
    as many for a complex one) from the sums, extremes and counts of a pass over it."""
    finite_count = components - nan - posinf - neginf
    if finite_count == 0:
        return TensorStats(math.nan, math.nan, math.nan, math.nan, nan, posinf, neginf, numel)
    return TensorStats(
        max=_positive_zero(hi),
        min=_positive_zero(lo),
        mean=total / finite_count,
        norm=math.sqrt(sq_total),
        nan_count=nan,
        posinf_count=posinf,
        neginf_count=neginf,
        numel=numel,
    )


def _torch_stats(
    t: torch.Tensor, bit_sum: bool
) -> tuple[float, float, float, float, int, int, int, int]:
    """(sum, sum of squares, min, max) of the finite elements, (nan, +inf, -inf) counts and,
    with ``bit_sum``, the sum of the elements' bit patterns (modulo 2**32 or 2**64), each
    chunk's while it is in cache."""
    total = 0.0
    sq_total = 0.0
    lo = math.inf
    hi = -math.inf
    nan = posinf = neginf = bits = 0
    floating = t.is_floating_point()
    flat = flatten_detached(t)
    integers = _stats_pass.SIGNED_BITS.get(t.element_size()) if bit_sum else None
    for start in range(0, flat.numel(), CHUNK_NUMEL):
        if integers is not None:
            raw = flat[start : start + CHUNK_NUMEL].view(integers)
            bits += int(raw.sum(dtype=torch.int32 if raw.element_size() <= 4 else torch.int64))
        chunk = with_reduction_kernels(chunk_of(flat, start, CHUNK_NUMEL))
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
    return total, sq_total, lo, hi, nan, posinf, neginf, bits
