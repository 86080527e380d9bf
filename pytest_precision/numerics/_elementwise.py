"""Per-element errors of one chunk (abs, rel, floored rel, ULP, allclose excess) and the rules
that bound them: plain data, so the torch pipeline here and the numba kernels evaluate the same
rule; the failure report reuses the same pass to find the worst elements."""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from . import _kernel_layout as layout
from ._dtypes import FLOAT_FORMATS


@dataclass
class ChunkErrors:
    """Float64 per-element errors of one chunk, as seen by a standard's elementwise rule.

    ``scratch`` is a float64 work buffer of the chunk's size that rules may overwrite.

    Elements where either side is non-finite are zeroed in every field (they are judged
    separately), so rules only see finite values.
    """

    abs_err: torch.Tensor
    expected_abs: torch.Tensor
    rel_err: torch.Tensor
    ulp_err: torch.Tensor
    actual: torch.Tensor
    expected: torch.Tensor
    raw_actual: torch.Tensor
    raw_expected: torch.Tensor
    scratch: torch.Tensor
    #: Largest element of ``rel_err``, once the pass has reduced it (lets rules skip work).
    rel_max: float | None = None


#: A per-element quantity and the limit above which an element counts.
Exceedance = tuple[torch.Tensor, float]


class Quantity(enum.IntEnum):
    """Per-element quantities an :class:`ElementRule` can bound (codes shared with the
    kernels)."""

    ABS_ERR = layout.ABS_ERR
    REL_ERR = layout.REL_ERR
    #: ``|a - e| / max(|e|, small_value)``: relative, but absolute for tiny expected values.
    FLOORED_REL_ERR = layout.FLOORED_REL_ERR
    ULP_ERR = layout.ULP_ERR
    #: ``|a - e| - rtol * |e|``: above ``atol`` exactly where torch.isclose fails.
    ALLCLOSE_EXCESS = layout.ALLCLOSE_EXCESS
    #: 1 where the raw values differ (integers beyond 2 ** 53 do not survive float64).
    DIFFERS = 5


@dataclass(frozen=True)
class ElementRule:
    """Per-element classification supplied by a standard, as plain data.

    An element counts for a limit where its quantity is above it. The first limit marks
    mismatches (elements outside the tolerance); further limits are counters the standard
    interprets (tiers, guards). ``small_value`` and ``rtol`` parametrize the floored relative
    error and the allclose excess.
    """

    limits: tuple[tuple[Quantity, float], ...]
    small_value: float = 0.0
    rtol: float = 0.0

    def exceedances(self, errors: ChunkErrors) -> list[Exceedance]:
        """The (values, limit) pairs of one chunk, computed by torch. A floored relative error
        may live in ``errors.scratch``; so may an allclose excess, but not both."""
        floored: torch.Tensor | None = None
        tightest = min(
            (limit for q, limit in self.limits if q == Quantity.FLOORED_REL_ERR), default=0.0
        )
        if self.small_value <= 0.0:
            # No floor: the floored error is the relative one, which reads a pair of zeros as 0
            # (the division would give a NaN, and a NaN maximum hides every count).
            floored = errors.rel_err
        elif errors.rel_max is not None and errors.rel_max <= tightest:
            # The floored error never exceeds the plain relative error: when that is within
            # every limit, it stands in for the floored one and no element counts.
            floored = errors.rel_err
        out: list[Exceedance] = []
        for quantity, limit in self.limits:
            if quantity == Quantity.FLOORED_REL_ERR:
                if floored is None:
                    floored = errors.scratch
                    torch.clamp(errors.expected_abs, min=self.small_value, out=floored)
                    torch.div(errors.abs_err, floored, out=floored)
                values = floored
            elif quantity == Quantity.ALLCLOSE_EXCESS:
                values = torch.mul(errors.expected_abs, -self.rtol, out=errors.scratch)
                values.add_(errors.abs_err)
            elif quantity == Quantity.DIFFERS:
                values = torch.ne(errors.raw_actual, errors.raw_expected).to(torch.uint8)
            else:
                values = {
                    Quantity.ABS_ERR: errors.abs_err,
                    Quantity.REL_ERR: errors.rel_err,
                    Quantity.ULP_ERR: errors.ulp_err,
                }[quantity]
            out.append((values, limit))
        return out


def _ulp_bits(dtype: torch.dtype) -> tuple[int, int]:
    """(offset, floor) of the ULP as float64 bit patterns: the ULP of x in ``dtype`` is
    2 ** (exponent(x) - bits + 1), floored at the spacing of the subnormal range, which is a
    shift of the exponent field. (Float64 ULPs are floored at 2 ** -1022, the smallest normal
    float64.)"""
    bits, emin = FLOAT_FORMATS.get(dtype, FLOAT_FORMATS[torch.float64])
    return (bits - 1) << 52, max(emin + 1023 - (bits - 1), 1) << 52


class ChunkPass:
    """Float64 work buffers and the per-chunk error computation shared by every pass."""

    def __init__(self, dtype: torch.dtype, device: torch.device, chunk_numel: int) -> None:
        self._ulp_offset, self._min_ulp_bits = _ulp_bits(dtype)
        self._buffers = [
            torch.empty(chunk_numel, dtype=torch.float64, device=device) for _ in range(6)
        ]
        self._ulp_bits = torch.empty(chunk_numel, dtype=torch.int64, device=device)

    def errors(self, a: torch.Tensor, e: torch.Tensor, finite: torch.Tensor | None) -> ChunkErrors:
        """Errors of one chunk; ``finite`` (if given) masks the elements finite on both sides."""
        n = a.numel()
        a64, e64, diff, e_abs, rel, scratch = (buf[:n] for buf in self._buffers)
        ulp_bits = self._ulp_bits[:n]
        a64.copy_(a)
        e64.copy_(e)
        if finite is not None:
            a64.masked_fill_(~finite, 0.0)
            e64.masked_fill_(~finite, 0.0)
        torch.sub(a64, e64, out=diff).abs_()
        torch.abs(e64, out=e_abs)
        torch.div(diff, e_abs, out=rel).nan_to_num_(nan=0.0, posinf=math.inf)
        torch.bitwise_and(e_abs.view(torch.int64), layout.EXPONENT_BITS, out=ulp_bits)
        ulp_bits.sub_(self._ulp_offset).clamp_(min=self._min_ulp_bits)
        ulp = ulp_bits.view(torch.float64)
        torch.div(diff, ulp, out=ulp)
        return ChunkErrors(diff, e_abs, rel, ulp, a64, e64, a, e, scratch)


def _count(mask: torch.Tensor) -> torch.Tensor:
    return mask.sum(dtype=torch.int32)


def _count_exceedances(
    exceedances: Sequence[Exceedance], known_maxima: dict[int, float]
) -> torch.Tensor:
    """Elements above each limit, in the order given.

    Comparisons cost four times a reduction, so each distinct values tensor is compared once,
    against its lowest limit, and only when its maximum exceeds that limit; its higher limits
    are counted on the few elements that passed the first. ``known_maxima`` maps
    ``id(values)`` to maxima already reduced.
    """
    counts: list[torch.Tensor | None] = [None] * len(exceedances)
    groups: dict[int, list[int]] = {}
    for position, (values, _) in enumerate(exceedances):
        groups.setdefault(id(values), []).append(position)
    for positions in groups.values():
        values = exceedances[positions[0]][0]
        zero = torch.zeros((), dtype=torch.int32, device=values.device)
        maximum = known_maxima.get(id(values))
        if maximum is None:
            maximum = float(values.amax()) if values.numel() else -math.inf
        ordered = sorted(positions, key=lambda p: exceedances[p][1])
        lowest = exceedances[ordered[0]][1]
        if not maximum > lowest:
            for p in ordered:
                counts[p] = zero
            continue
        above = values[values > lowest]
        for p in ordered:
            counts[p] = _count(above > exceedances[p][1])
    return torch.stack([c for c in counts if c is not None])
