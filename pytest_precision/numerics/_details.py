"""What a failure report shows beyond the metrics: the worst elements with their indices, the
first mismatches and a histogram of relative errors (computed only when a comparison fails)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ._chunks import CHUNK_NUMEL, chunk_of, flatten_detached, ravel_index, unravel_index
from ._dtypes import lower_precision
from ._measure import ChunkPass, ElementRule

#: How far apart the elementwise ratios actual / expected may be, relative to their distance
#: from 1, for the pair to read as one uniform scale (rounding spreads them far wider).
SCALE_SPREAD = 1e-3

#: Upper edges of the relative-error histogram buckets (by decade); a last bucket holds the rest.
HISTOGRAM_EDGES: tuple[float, ...] = (0.0, 1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0)


@dataclass(frozen=True)
class Element:
    """One element of a comparison, for reports."""

    index: tuple[int, ...]
    actual: float
    expected: float
    abs_err: float
    rel_err: float


@dataclass(frozen=True)
class ErrorDetails:
    """What a failure report shows beyond the metrics.

    ``histogram`` counts elements per relative-error bucket: exactly 0, then up to each of
    ``HISTOGRAM_EDGES[1:]``, then above the last edge (including inf); only pairs finite on both
    sides are counted. ``required_atol`` is the
    smallest atol that passes every element at the given rtol; ``required_rtol`` the smallest
    rtol at the given atol (inf when an element with expected 0 exceeds atol, and both inf when
    non-finite values differ). ``scale``: the factor when every actual element is its expected
    one times the same number (within :data:`SCALE_SPREAD` of its distance from 1; expected
    zeros matched by zeros): a wrong constant, not rounding. None otherwise.
    """

    first_mismatches: tuple[Element, ...]
    worst: tuple[Element, ...]
    requested: tuple[Element, ...]
    histogram: tuple[int, ...]
    required_atol: float
    required_rtol: float
    scale: float | None = None


def error_details(
    actual: torch.Tensor,
    expected: torch.Tensor,
    rule: ElementRule,
    *,
    rtol: float,
    atol: float,
    k: int = 5,
    indices: Sequence[tuple[int, ...]] = (),
    chunk_numel: int | None = None,
) -> ErrorDetails:
    """Locate the first ``k`` mismatches and the ``k`` largest absolute errors, bucket the
    relative errors by decade and find the tolerances that would have passed. The elements at
    ``indices`` (say, those of the greatest errors) are returned in ``requested``."""
    dtype = lower_precision(actual.dtype, expected.dtype)
    device = actual.device
    if chunk_numel is None:
        chunk_numel = CHUNK_NUMEL if device.type == "cpu" else 1 << 22
    work = ChunkPass(dtype, device, min(chunk_numel, max(actual.numel(), 1)))
    edges = torch.tensor(HISTOGRAM_EDGES, dtype=torch.float64, device=device)
    histogram = torch.zeros(len(HISTOGRAM_EDGES) + 1, dtype=torch.int64, device=device)
    first: list[int] = []
    worst_values = torch.empty(0, dtype=torch.float64, device=device)
    worst_index = torch.empty(0, dtype=torch.int64, device=device)
    need_atol = torch.zeros((), dtype=torch.float64, device=device)
    need_rtol = torch.zeros((), dtype=torch.float64, device=device)
    flat_a, flat_e = flatten_detached(actual), flatten_detached(expected)
    nonfinite_mismatch = False
    ratio_low, ratio_high, zeros_kept = math.inf, -math.inf, True
    for start in range(0, flat_a.numel(), chunk_numel):
        a, e = chunk_of(flat_a, start, chunk_numel), chunk_of(flat_e, start, chunk_numel)
        finite = torch.isfinite(a) & torch.isfinite(e)
        all_finite = bool(finite.all())
        err = work.errors(a, e, None if all_finite else finite)
        values, limit = rule.exceedances(err)[0]
        mismatch = values > limit
        rel_err = err.rel_err
        if not all_finite:
            same = (a == e) | (torch.isnan(a) & torch.isnan(e))
            bad = ~finite & ~same
            nonfinite_mismatch = nonfinite_mismatch or bool(bad.any())
            mismatch = mismatch | bad
            rel_err = rel_err[finite]  # the histogram counts finite pairs only
        if len(first) < k:
            found = torch.nonzero(mismatch)[: k - len(first), 0]
            first.extend(start + i for i in found.tolist())
        top = torch.topk(err.abs_err, min(k, a.numel()))
        worst_values = torch.cat([worst_values, top.values])
        worst_index = torch.cat([worst_index, top.indices + start])
        keep = torch.topk(worst_values, min(k, worst_values.numel()))
        worst_values, worst_index = keep.values, worst_index[keep.indices]
        histogram += torch.bincount(torch.bucketize(rel_err, edges), minlength=histogram.numel())
        if all_finite:
            nonzero = e != 0
            zeros_kept = zeros_kept and not bool(a[~nonzero].any())
            if bool(nonzero.any()):
                ratio = a[nonzero].double() / e[nonzero].double()
                ratio_low = min(ratio_low, float(ratio.amin()))
                ratio_high = max(ratio_high, float(ratio.amax()))
        need_atol = torch.maximum(need_atol, (err.abs_err - rtol * err.expected_abs).amax())
        need_rtol = torch.maximum(
            need_rtol,
            ((err.abs_err - atol).clamp_(min=0) / err.expected_abs)
            .nan_to_num_(nan=0.0, posinf=math.inf)
            .amax(),
        )
    shape = tuple(actual.shape)

    def element(flat: int) -> Element:
        a, e = float(flat_a[flat]), float(flat_e[flat])
        d = abs(a - e) if math.isfinite(a) and math.isfinite(e) else math.nan
        rel = d / abs(e) if e else (0.0 if d == 0 else math.inf)
        return Element(unravel_index(flat, shape), a, e, d, rel)

    return ErrorDetails(
        first_mismatches=tuple(element(i) for i in first),
        worst=tuple(element(i) for i in worst_index.tolist()),
        requested=tuple(element(ravel_index(i, shape)) for i in indices),
        histogram=tuple(histogram.tolist()),
        # No tolerance admits a non-finite mismatch.
        required_atol=math.inf if nonfinite_mismatch else max(float(need_atol), 0.0),
        required_rtol=math.inf if nonfinite_mismatch else float(need_rtol),
        scale=_uniform_scale(ratio_low, ratio_high, zeros_kept and not nonfinite_mismatch),
    )


def _uniform_scale(low: float, high: float, zeros_kept: bool) -> float | None:
    """The common factor of the elementwise ratios ``low`` .. ``high``, if they are one."""
    if not zeros_kept or not math.isfinite(low) or not math.isfinite(high):
        return None
    middle = (low + high) / 2
    off = abs(middle - 1)
    return middle if off > 0 and high - low <= SCALE_SPREAD * off else None
