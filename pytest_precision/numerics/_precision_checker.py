"""The ``precision_checker`` standard: MindSpore Transformers' (mindformers) PrecisionChecker
acceptance rule, with its one-sided L1 check made two-sided.

The rule judges a whole tensor by three numbers, each computed here in float64:

* cosine similarity ``Σae / (‖a‖ ‖e‖)`` (from the shared metrics pass);
* the L1 ratio ``Σ|a| / Σ|e|``;
* the KL divergence ``KL(p ‖ q)`` of the two flattened tensors read as logits,
  ``p = softmax(e)`` and ``q = softmax(a)``.

The L1 ratio is the rule's main scale check; the KL term sees a scale only as far as the values
are large enough to sharpen the softmax (values well below 1 leave it almost uniform). Checked
one-sided (``Σ|a| / Σ|e| - 1 < l1_tol``, as in mindformers) it misses a tensor that came out
too small: ``0.90 * expected`` of small values passes. ``two_sided=True`` (the default) checks
``|Σ|a| / Σ|e| - 1| < l1_tol``; ``PrecisionChecker(two_sided=False)`` keeps the original rule.
Neither catches a handful of wrong elements that leave the three sums almost unchanged (one
sign-flipped element in 4096): the ``ratio`` standard's max-element guard does
(docs/standards.md). The comparisons are strict, as in mindformers.

The L1 sums and the KL term need more than the shared metrics pass, so the standard measures
them itself (:meth:`PrecisionChecker.bind`), in one more chunked float64 pass on the tensors'
own device (the softmax normalizers streamed with a running maximum), only when it is selected.
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
    #: KL(softmax(e) ‖ softmax(a)) = Σ p (e - a) - lse(e) + lse(a); 0 with no finite element
    kl: float

    @property
    def l1_ratio(self) -> float:
        """``Σ|a| / Σ|e|``: 1 when both are 0, inf when only the expected side is."""
        if self.expected_l1 == 0.0:
            return 1.0 if self.actual_l1 == 0.0 else math.inf
        return self.actual_l1 / self.expected_l1


class _LogSumExp:
    """``log Σ exp(x)`` streamed over chunks with a running maximum, and alongside it
    ``Σ exp(x) w`` for a weight ``w`` per element, rescaled whenever the maximum grows."""

    def __init__(self) -> None:
        self.peak = -math.inf
        self.total = 0.0  # Σ exp(x - peak)
        self.weighted = 0.0  # Σ exp(x - peak) w

    def add(self, x: torch.Tensor, weight: torch.Tensor | None = None) -> None:
        if x.numel() == 0:
            return
        peak = max(self.peak, float(x.max()))
        scale = math.exp(self.peak - peak)
        terms = torch.exp(x - peak)
        sums = torch.stack(
            [terms.sum(), (terms * weight).sum() if weight is not None else terms[0]]
        )
        total, weighted = sums.tolist()
        self.total = self.total * scale + total
        self.weighted = self.weighted * scale + weighted
        self.peak = peak

    @property
    def value(self) -> float:
        return self.peak + math.log(self.total) if self.total > 0 else -math.inf


def magnitude_sums(
    actual: torch.Tensor, expected: torch.Tensor, *, chunk_numel: int | None = None
) -> MagnitudeSums:
    """Σ|a|, Σ|e| and the softmax KL in one chunked float64 pass on the tensors' device;
    elements non-finite on either side are left out (as in every other metric)."""
    flat_a, flat_e = flatten_detached(actual), flatten_detached(expected)
    device = flat_a.device
    if chunk_numel is None:
        chunk_numel = CHUNK_NUMEL if device.type == "cpu" else 1 << 22
    l1 = torch.zeros(2, dtype=torch.float64, device=device)
    lse_a, lse_e = _LogSumExp(), _LogSumExp()
    for start in range(0, flat_a.numel(), chunk_numel):
        a = chunk_of(flat_a, start, chunk_numel).to(torch.float64)
        e = chunk_of(flat_e, start, chunk_numel).to(torch.float64)
        finite = torch.isfinite(a) & torch.isfinite(e)
        if not bool(finite.all()):
            a, e = a[finite], e[finite]
        l1 += torch.stack([a.abs().sum(), e.abs().sum()])
        lse_a.add(a)
        lse_e.add(e, weight=e - a)
    actual_l1, expected_l1 = l1.tolist()
    kl = 0.0
    if lse_e.total > 0:
        # Σ p (e - a) - lse(e) + lse(a), with p = exp(e - peak) / total
        kl = max(lse_e.weighted / lse_e.total - lse_e.value + lse_a.value, 0.0)
    return MagnitudeSums(actual_l1, expected_l1, kl)


@dataclass(frozen=True)
class PrecisionChecker(Standard):
    """mindformers' PrecisionChecker: cosine > ``cosine_min``, L1 ratio within ``l1_tol`` of 1
    (both sides when ``two_sided``, else only above), KL < ``kl_max`` (see the module doc).

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
        l1_ok = (abs(deviation) if self.two_sided else deviation) < self.l1_tol
        l1_limit = f"|ratio - 1| < {self.l1_tol:g}" if self.two_sided else f"< {1 + self.l1_tol:g}"
        return {
            "cosine": (
                comparison.cosine,
                comparison.cosine > self.cosine_min,
                f"> {self.cosine_min:g}",
            ),
            "l1_ratio": (ratio, l1_ok, l1_limit),
            "kl": (kl, kl < self.kl_max, f"< {self.kl_max:g}"),
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
