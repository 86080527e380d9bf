"""Standards: the rules that turn float64 metrics into a verdict (pass / warn / fail).

Each standard carries per-dtype tables (plain data, overridable per call) and an elementwise
rule that classifies elements during the single metrics pass. ``compare_tensors`` picks the
standard, runs the pass and judges.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar, Literal

import torch

from .._errors import PrecisionInputError
from ._dtypes import FLOAT_FORMATS, dtype_name
from ._measure import ElementRule, ErrorMetrics, Quantity

Verdict = Literal["pass", "warn", "fail"]


#: Verdicts from best to worst.
VERDICT_ORDER: dict[Verdict, int] = {"pass": 0, "warn": 1, "fail": 2}


#: (actual vs reference, expected vs reference)
ReferencePair = tuple[ErrorMetrics, ErrorMetrics]


StandardName = Literal[
    "allclose", "ratio", "ulp", "reference", "exact", "model", "spread", "precision_checker"
]


#: torch.testing.assert_close's default (rtol, atol) per dtype.
ALLCLOSE_TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float16: (1e-3, 1e-5),
    torch.bfloat16: (1.6e-2, 1e-5),
    torch.float32: (1.3e-6, 1e-5),
    torch.float64: (1e-7, 1e-7),
}


@dataclass(frozen=True)
class RatioTier:
    """Ratio-standard limits for one dtype.

    An element's error is ``|a - e| / max(|e|, small_value)``: relative for normal values,
    absolute (scaled by ``small_value``) for tiny ones. The verdict is ``pass`` when at least
    ``pass_share`` of the elements are within ``pass_rtol``, ``warn`` when at least
    ``warn_share`` are within ``warn_rtol``, else ``fail``; any element beyond ``guard_rtol``
    fails outright, so a few badly wrong elements cannot hide inside a good share.
    """

    pass_rtol: float
    pass_share: float
    warn_rtol: float
    warn_share: float
    guard_rtol: float
    small_value: float


#: msprobe's accuracy-checker tiers for fp16 and fp32; bf16's pass tier is widened to two bf16
#: roundings (2 ** -7), since one rounding alone already reaches 2 ** -8 > 1e-3.
RATIO_TIERS: dict[torch.dtype, RatioTier] = {
    torch.float64: RatioTier(1e-9, 0.9999, 1e-7, 0.999, 1e-5, 2.0**-40),
    torch.float32: RatioTier(1e-4, 0.9999, 1e-3, 0.999, 1e-2, 2.0**-20),
    torch.float16: RatioTier(1e-3, 0.999, 1e-2, 0.99, 0.1, 2.0**-10),
    torch.bfloat16: RatioTier(2.0**-7, 0.999, 1e-2, 0.99, 0.5, 2.0**-10),
}


@dataclass(frozen=True)
class UlpLimit:
    """ULP-standard limits for one dtype: mean ULP error, share of elements above
    ``element_ulp``, and a per-element guard."""

    max_mean_ulp: float
    element_ulp: float
    max_share_over: float
    guard_ulp: float


#: msprobe's ULP rules: fp32 mean ULP error < 64; fp16/bf16 under 0.1 % of elements above 1 ULP.
ULP_LIMITS: dict[torch.dtype, UlpLimit] = {
    torch.float64: UlpLimit(64.0, 64.0, 1.0, 2.0**20),
    torch.float32: UlpLimit(64.0, 64.0, 1.0, 2.0**12),
    torch.float16: UlpLimit(math.inf, 1.0, 0.001, 64.0),
    torch.bfloat16: UlpLimit(math.inf, 1.0, 0.001, 64.0),
}


@dataclass(frozen=True)
class ReferenceLimit:
    """Largest allowed ratios of the target's error to the baseline's error, both measured
    against a float64 reference: max abs error (the max-element guard), mean abs error, RMSE.
    Ratios up to ``warn_factor`` times the limits give ``warn``."""

    max_abs_ratio: float
    mean_abs_ratio: float
    rmse_ratio: float
    warn_factor: float = 1.5


#: msprobe's benchmark limits for matmul-like ops; other ops get looser ones.
REFERENCE_LIMITS: dict[str, ReferenceLimit] = {
    "matmul": ReferenceLimit(2.0, 1.2, 1.2),
    "default": ReferenceLimit(5.0, 2.0, 2.0),
}


@dataclass(frozen=True)
class Judgement:
    verdict: Verdict
    reason: str


class Standard:
    """A pass/fail rule. Subclasses hold their tables as dataclass fields."""

    name: ClassVar[StandardName]

    def rule(self, dtype: torch.dtype) -> ElementRule:
        raise NotImplementedError

    def bind(self, actual: torch.Tensor, expected: torch.Tensor) -> Standard:
        """The standard ready to judge this pair: one that needs more than the shared metrics
        pass measures it here (``precision_checker``); the others are ready as they are."""
        return self

    def judge(self, comparison: ErrorMetrics, vs_reference: ReferencePair | None) -> Judgement:
        raise NotImplementedError

    def tolerances(self, dtype: torch.dtype) -> tuple[float, float]:
        """The (rtol, atol) pair this standard applies elementwise, for "what would pass"."""
        raise NotImplementedError


def _table_entry(table: Mapping[torch.dtype, object], dtype: torch.dtype, standard: str) -> object:
    try:
        return table[dtype]
    except KeyError:
        known = ", ".join(sorted(dtype_name(d) for d in table))
        raise PrecisionInputError(
            f"the {standard} standard has no limits for dtype {dtype} (it knows: {known}); "
            "pass explicit tolerances or another standard"
        ) from None


def _nonfinite_failure(m: ErrorMetrics) -> Judgement | None:
    if m.nonfinite_mismatch_count:
        a, e = m.actual_nonfinite, m.expected_nonfinite
        return Judgement(
            "fail",
            f"{m.nonfinite_mismatch_count} non-finite value(s) differ "
            f"(actual: {a.nan} nan, {a.posinf} +inf, {a.neginf} -inf; "
            f"expected: {e.nan} nan, {e.posinf} +inf, {e.neginf} -inf)",
        )
    return None


@dataclass(frozen=True)
class AllClose(Standard):
    """``|a - e| <= atol + rtol * |e|`` for every element (torch.testing's rule, in float64)."""

    rtol: float | None = None
    atol: float | None = None
    table: Mapping[torch.dtype, tuple[float, float]] = field(
        default_factory=lambda: dict(ALLCLOSE_TOLERANCES)
    )
    name: ClassVar[StandardName] = "allclose"

    def tolerances(self, dtype: torch.dtype) -> tuple[float, float]:
        default = self.table.get(dtype, (0.0, 0.0))
        rtol = default[0] if self.rtol is None else self.rtol
        atol = default[1] if self.atol is None else self.atol
        return rtol, atol

    def rule(self, dtype: torch.dtype) -> ElementRule:
        rtol, atol = self.tolerances(dtype)
        return _allclose_rule(rtol, atol)

    def judge(self, comparison: ErrorMetrics, vs_reference: ReferencePair | None) -> Judgement:
        rtol, atol = self.tolerances(comparison.dtype)
        bad = _nonfinite_failure(comparison)
        if bad is not None:
            return bad
        k = comparison.mismatch_count
        if k:
            return Judgement(
                "fail",
                f"{k} element(s) exceed atol + rtol * |expected| (rtol={rtol:g}, atol={atol:g})",
            )
        return Judgement("pass", f"all elements within atol={atol:g} + rtol={rtol:g} * |expected|")


def _allclose_rule(rtol: float, atol: float) -> ElementRule:
    """``|a - e| - rtol * |e| > atol``: torch.isclose's test, rearranged so that the chunk's
    maximum doubles as the smallest atol that would pass."""
    return ElementRule(((Quantity.ALLCLOSE_EXCESS, atol),), rtol=rtol)


@dataclass(frozen=True)
class Ratio(Standard):
    """Share of elements within a relative error, in tiers per dtype (see :class:`RatioTier`)."""

    tiers: Mapping[torch.dtype, RatioTier] = field(default_factory=lambda: dict(RATIO_TIERS))
    name: ClassVar[StandardName] = "ratio"

    def tier(self, dtype: torch.dtype) -> RatioTier:
        return _table_entry(self.tiers, dtype, self.name)  # type: ignore[return-value]

    def tolerances(self, dtype: torch.dtype) -> tuple[float, float]:
        t = self.tier(dtype)
        return t.pass_rtol, t.pass_rtol * t.small_value

    def rule(self, dtype: torch.dtype) -> ElementRule:
        t = self.tier(dtype)
        floored = Quantity.FLOORED_REL_ERR
        return ElementRule(
            ((floored, t.pass_rtol), (floored, t.warn_rtol), (floored, t.guard_rtol)),
            small_value=t.small_value,
        )

    def judge(self, comparison: ErrorMetrics, vs_reference: ReferencePair | None) -> Judgement:
        bad = _nonfinite_failure(comparison)
        if bad is not None:
            return bad
        t = self.tier(comparison.dtype)
        n = max(comparison.finite_count, 1)
        over_pass, over_warn, gross = comparison.rule_counts
        within_pass, within_warn = 1 - over_pass / n, 1 - over_warn / n
        guard = (
            f"{gross} element(s) off by more than {t.guard_rtol:g} relative (max-element guard;"
            f" values below {t.small_value:g} judged absolutely)"
        )
        if gross and within_warn >= t.warn_share:
            return Judgement("fail", guard)
        if within_pass >= t.pass_share and not gross:
            return Judgement(
                "pass",
                f"{_pct(within_pass)} of elements within {t.pass_rtol:.3g} relative error "
                f"(needs {_pct(t.pass_share)})",
            )
        tiers = (
            f"{_pct(within_pass)} within {t.pass_rtol:.3g} (pass needs {_pct(t.pass_share)}), "
            f"{_pct(within_warn)} within {t.warn_rtol:.3g}"
        )
        if within_warn >= t.warn_share:
            return Judgement("warn", f"{tiers} (warn tier needs {_pct(t.warn_share)})")
        return Judgement(
            "fail", f"{tiers} (needs {_pct(t.warn_share)})" + (f"; {guard}" if gross else "")
        )


@dataclass(frozen=True)
class Ulp(Standard):
    """Error in units of last place of the (lower-precision) dtype, see :class:`UlpLimit`."""

    limits: Mapping[torch.dtype, UlpLimit] = field(default_factory=lambda: dict(ULP_LIMITS))
    name: ClassVar[StandardName] = "ulp"

    def limit(self, dtype: torch.dtype) -> UlpLimit:
        return _table_entry(self.limits, dtype, self.name)  # type: ignore[return-value]

    def tolerances(self, dtype: torch.dtype) -> tuple[float, float]:
        ulp = self.limit(dtype).element_ulp * 2.0 ** (1 - FLOAT_FORMATS[dtype][0])
        return ulp, 0.0

    def rule(self, dtype: torch.dtype) -> ElementRule:
        lim = self.limit(dtype)
        return ElementRule(((Quantity.ULP_ERR, lim.element_ulp), (Quantity.ULP_ERR, lim.guard_ulp)))

    def judge(self, comparison: ErrorMetrics, vs_reference: ReferencePair | None) -> Judgement:
        bad = _nonfinite_failure(comparison)
        if bad is not None:
            return bad
        lim = self.limit(comparison.dtype)
        over, gross = comparison.rule_counts
        share = over / max(comparison.finite_count, 1)
        dtype = dtype_name(comparison.dtype)
        if gross:
            return Judgement("fail", f"{gross} element(s) off by more than {lim.guard_ulp:g} ULP")
        if comparison.mean_ulp >= lim.max_mean_ulp:
            return Judgement(
                "fail", f"mean error {comparison.mean_ulp:.3g} ULP (needs < {lim.max_mean_ulp:g})"
            )
        if share > lim.max_share_over:
            return Judgement(
                "fail",
                f"{_pct(share)} of elements above {lim.element_ulp:g} ULP of {dtype} "
                f"(allowed {_pct(lim.max_share_over)})",
            )
        return Judgement(
            "pass",
            f"mean {comparison.mean_ulp:.3g} ULP, max {comparison.max_ulp:.3g} ULP of {dtype}",
        )


@dataclass(frozen=True)
class Reference(Standard):
    """Target error vs a float64 reference at most k times the baseline's (see
    :class:`ReferenceLimit`). Needs ``reference=`` in the comparison."""

    op_class: str = "default"
    limits: Mapping[str, ReferenceLimit] = field(default_factory=lambda: dict(REFERENCE_LIMITS))
    name: ClassVar[StandardName] = "reference"

    def limit(self) -> ReferenceLimit:
        try:
            return self.limits[self.op_class]
        except KeyError:
            known = ", ".join(sorted(self.limits))
            raise PrecisionInputError(
                f"unknown op class {self.op_class!r} for the reference standard (known: {known})"
            ) from None

    def tolerances(self, dtype: torch.dtype) -> tuple[float, float]:
        return ALLCLOSE_TOLERANCES.get(dtype, (0.0, 0.0))

    def rule(self, dtype: torch.dtype) -> ElementRule:
        rtol, atol = self.tolerances(dtype)
        return _allclose_rule(rtol, atol)

    def judge(self, comparison: ErrorMetrics, vs_reference: ReferencePair | None) -> Judgement:
        bad = _nonfinite_failure(comparison)
        if bad is not None:
            return bad
        if vs_reference is None:
            raise PrecisionInputError(
                "the reference standard needs reference= (the same computation in float64)"
            )
        target, baseline = vs_reference
        if target.nonfinite_mismatch_count:
            return Judgement(
                "fail",
                f"{target.nonfinite_mismatch_count} non-finite value(s) where the float64 "
                "reference differs",
            )
        lim = self.limit()
        values = reference_ratios(comparison.dtype, target, baseline, lim)
        shown = ", ".join(f"{k} {r:.3g}x (limit {limit:g})" for k, (r, limit) in values.items())
        worst = max(r / limit for r, limit in values.values())
        if worst <= 1.0:
            return Judgement("pass", f"error vs float64 reference within limits: {shown}")
        if worst <= lim.warn_factor:
            return Judgement("warn", f"error vs float64 reference near limits: {shown}")
        return Judgement("fail", f"error vs float64 reference beyond limits: {shown}")


def reference_ratios(
    dtype: torch.dtype, target: ErrorMetrics, baseline: ErrorMetrics, lim: ReferenceLimit
) -> dict[str, tuple[float, float]]:
    """``{metric: (target error / baseline error, limit)}``, both errors against float64."""
    # Baseline errors are floored at one rounding of the reference's scale, so a baseline
    # that matches the reference exactly does not demand an exact target.
    unit = 2.0 ** -FLOAT_FORMATS.get(dtype, FLOAT_FORMATS[torch.float64])[0]
    floor = unit * max(baseline.expected_rms, math.ldexp(1.0, -1074))
    ratios = {
        "max abs": (target.max_abs_err, baseline.max_abs_err, lim.max_abs_ratio),
        "mean abs": (target.mean_abs_err, baseline.mean_abs_err, lim.mean_abs_ratio),
        "rmse": (target.rmse, baseline.rmse, lim.rmse_ratio),
    }
    return {k: (t / max(b, floor), limit) for k, (t, b, limit) in ratios.items()}


@dataclass(frozen=True)
class Exact(Standard):
    """Bitwise equality: integers, bools, indices, and determinism checks."""

    name: ClassVar[StandardName] = "exact"

    def tolerances(self, dtype: torch.dtype) -> tuple[float, float]:
        return 0.0, 0.0

    def rule(self, dtype: torch.dtype) -> ElementRule:
        # Floats convert to float64 exactly and non-finite pairs are judged apart, so a nonzero
        # float64 difference is a difference; integers beyond 2 ** 53 need the raw values.
        if dtype.is_floating_point:
            return ElementRule(((Quantity.ABS_ERR, 0.0),))
        return ElementRule(((Quantity.DIFFERS, 0.0),))

    def judge(self, comparison: ErrorMetrics, vs_reference: ReferencePair | None) -> Judgement:
        k = comparison.mismatch_count
        if k:
            return Judgement("fail", f"{k} element(s) differ (exact comparison)")
        return Judgement("pass", "all elements equal")


def _pct(share: float) -> str:
    return f"{100 * share:.4g} %"
