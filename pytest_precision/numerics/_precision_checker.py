"""The ``precision_checker`` standard: MindSpore Transformers' (mindformers) PrecisionChecker
acceptance rule, with its one-sided L1 check made two-sided.

The rule judges a whole tensor by three numbers, each computed here in float64:

* cosine similarity ``Σae / (‖a‖ ‖e‖)`` (from the shared metrics pass);
* the L1 ratio ``Σ|a| / Σ|e|``;
* the KL divergence ``KL(p ‖ q)`` of the two tensors read as distributions of magnitude,
  ``p = |e| / Σ|e|`` and ``q = |a| / Σ|a|``.

Cosine and KL do not see a common scale factor, so the L1 ratio is the rule's only scale check;
checked one-sided (``Σ|a| / Σ|e| - 1 ≤ l1_tol``, as in the guide) it misses a tensor that came
out too small: ``0.90 * expected`` passes. ``two_sided=True`` (the default) checks
``|Σ|a| / Σ|e| - 1| ≤ l1_tol``; ``PrecisionChecker(two_sided=False)`` keeps the original rule.
Neither catches a handful of wrong elements that leave the three sums almost unchanged (one
sign-flipped element in 4096): the ``ratio`` standard's max-element guard does
(docs/standards.md).

The L1 sums and the KL term need more than the shared metrics pass, so the standard measures
them itself (:meth:`PrecisionChecker.bind`), in one more chunked float64 pass on the tensors'
own device, only when it is selected.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import ClassVar

import torch

from .._errors import PrecisionInputError
from ._chunks import CHUNK_NUMEL, chunk_of, flatten_detached
from ._measure import ElementRule, ErrorMetrics
from ._standards import (
    ALLCLOSE_TOLERANCES,
    STANDARDS,
    Judgement,
    ReferencePair,
    Standard,
    StandardName,
    _allclose_rule,
    _nonfinite_failure,
)

#: The guide's thresholds: cosine similarity, L1-ratio deviation, KL divergence.
COSINE_MIN = 0.999
L1_TOL = 0.01
KL_MAX = 0.005


@dataclass(frozen=True)
class MagnitudeSums:
    """What the extra pass accumulates over the elements finite on both sides (float64)."""

    actual_l1: float  # Σ|a|
    expected_l1: float  # Σ|e|
    cross: float  # Σ_{e != 0} |e| (log|e| - log|a|); inf where a == 0 != e

    @property
    def l1_ratio(self) -> float:
        """``Σ|a| / Σ|e|``: 1 when both are 0, inf when only the expected side is."""
        if self.expected_l1 == 0.0:
            return 1.0 if self.actual_l1 == 0.0 else math.inf
        return self.actual_l1 / self.expected_l1

    @property
    def kl(self) -> float:
        """``KL(|e| / Σ|e| ‖ |a| / Σ|a|)`` = ``cross / Σ|e| + log(Σ|a| / Σ|e|)``; 0 for two
        all-zero sides, inf when only one side is all zero or ``a`` is 0 where ``e`` is not."""
        if self.expected_l1 == 0.0 or self.actual_l1 == 0.0:
            return 0.0 if self.expected_l1 == self.actual_l1 else math.inf
        if math.isinf(self.cross):
            return math.inf
        value = self.cross / self.expected_l1 + math.log(self.actual_l1 / self.expected_l1)
        return max(value, 0.0)  # float64 cancellation can leave -1e-17 for identical sides


def magnitude_sums(
    actual: torch.Tensor, expected: torch.Tensor, *, chunk_numel: int | None = None
) -> MagnitudeSums:
    """Σ|a|, Σ|e| and the KL cross term in one chunked float64 pass on the tensors' device;
    elements non-finite on either side are left out (as in every other metric)."""
    flat_a, flat_e = flatten_detached(actual), flatten_detached(expected)
    device = flat_a.device
    if chunk_numel is None:
        chunk_numel = CHUNK_NUMEL if device.type == "cpu" else 1 << 22
    sums = torch.zeros(3, dtype=torch.float64, device=device)
    for start in range(0, flat_a.numel(), chunk_numel):
        a = chunk_of(flat_a, start, chunk_numel).to(torch.float64).abs()
        e = chunk_of(flat_e, start, chunk_numel).to(torch.float64).abs()
        finite = torch.isfinite(a) & torch.isfinite(e)
        a = torch.where(finite, a, 0.0)
        e = torch.where(finite, e, 0.0)
        # |e| (log|e| - log|a|), 0 where e == 0 (the limit of p log p), inf where a == 0 != e.
        term = torch.where(e > 0, e * (torch.log(e) - torch.log(a)), 0.0)
        sums += torch.stack([a.sum(), e.sum(), term.sum()])
    actual_l1, expected_l1, cross = sums.tolist()
    return MagnitudeSums(actual_l1, expected_l1, cross)


@dataclass(frozen=True)
class PrecisionChecker(Standard):
    """mindformers' PrecisionChecker: cosine ≥ ``cosine_min``, L1 ratio within ``l1_tol`` of 1
    (both sides when ``two_sided``, else only above), KL ≤ ``kl_max`` (see the module doc).

    ``compare_tensors(..., standard="precision_checker")`` binds it to the pair (the extra
    pass); the :class:`TensorComparison` keeps the bound standard, whose ``sums`` hold the L1
    sums and the KL term."""

    cosine_min: float = COSINE_MIN
    l1_tol: float = L1_TOL
    kl_max: float = KL_MAX
    two_sided: bool = True
    sums: MagnitudeSums | None = field(default=None, compare=False, repr=False)
    name: ClassVar[StandardName] = "precision_checker"

    def bind(self, actual: torch.Tensor, expected: torch.Tensor) -> PrecisionChecker:
        return replace(self, sums=magnitude_sums(actual, expected))

    def tolerances(self, dtype: torch.dtype) -> tuple[float, float]:
        return ALLCLOSE_TOLERANCES.get(dtype, (0.0, 0.0))

    def rule(self, dtype: torch.dtype) -> ElementRule:
        # Elementwise counts (mismatch_count) use torch.testing's tolerances; reported only.
        return _allclose_rule(*self.tolerances(dtype))

    def checks(self, comparison: ErrorMetrics) -> dict[str, tuple[float, bool, str]]:
        """``{check: (value, passed, limit as text)}`` for cosine, L1 ratio and KL."""
        if self.sums is None:
            raise PrecisionInputError(
                "the precision_checker standard measures the pair itself: judge through "
                "compare_tensors / assert_close, or call .bind(actual, expected) first"
            )
        ratio, kl = self.sums.l1_ratio, self.sums.kl
        deviation = ratio - 1.0
        l1_ok = (abs(deviation) if self.two_sided else deviation) <= self.l1_tol
        l1_limit = (
            f"|ratio - 1| <= {self.l1_tol:g}" if self.two_sided else f"<= {1 + self.l1_tol:g}"
        )
        return {
            "cosine": (
                comparison.cosine,
                comparison.cosine >= self.cosine_min,
                f">= {self.cosine_min:g}",
            ),
            "l1_ratio": (ratio, l1_ok, l1_limit),
            "kl": (kl, kl <= self.kl_max, f"<= {self.kl_max:g}"),
        }

    def judge(self, comparison: ErrorMetrics, vs_reference: ReferencePair | None) -> Judgement:
        bad = _nonfinite_failure(comparison)
        if bad is not None:
            return bad
        checks = self.checks(comparison)
        shown = "; ".join(
            f"{k} {v:.6g} ({'ok' if ok else 'FAILS'} {limit})"
            for k, (v, ok, limit) in checks.items()
        )
        failed = [k for k, (_, ok, _) in checks.items() if not ok]
        if failed:
            return Judgement("fail", f"precision_checker fails {', '.join(failed)}: {shown}")
        return Judgement("pass", f"precision_checker: {shown}")


STANDARDS[PrecisionChecker.name] = PrecisionChecker
