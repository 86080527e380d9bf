"""Standards: the rules that turn float64 metrics into a verdict (pass / warn / fail).

Each standard carries per-dtype tables (plain data, overridable per call) and an elementwise
rule that classifies elements during the single metrics pass. ``compare_tensors`` picks the
standard, runs the pass and judges.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Literal

import torch

from ._errors import PrecisionInputError
from ._metrics import (
    FLOAT_FORMATS,
    ElementRule,
    ErrorMetrics,
    NonFinite,
    Quantity,
    lower_precision,
    measure,
    tensor_stats,
)

Verdict = Literal["pass", "warn", "fail"]
#: Verdicts from best to worst.
VERDICT_ORDER: dict[Verdict, int] = {"pass": 0, "warn": 1, "fail": 2}
#: (actual vs reference, expected vs reference)
_ReferencePair = tuple[ErrorMetrics, ErrorMetrics]
StandardName = Literal["allclose", "ratio", "ulp", "reference", "exact"]

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

    def judge(self, comparison: ErrorMetrics, vs_reference: _ReferencePair | None) -> Judgement:
        raise NotImplementedError

    def tolerances(self, dtype: torch.dtype) -> tuple[float, float]:
        """The (rtol, atol) pair this standard applies elementwise, for "what would pass"."""
        raise NotImplementedError


def _table_entry(table: Mapping[torch.dtype, object], dtype: torch.dtype, standard: str) -> object:
    try:
        return table[dtype]
    except KeyError:
        known = ", ".join(sorted(str(d).removeprefix("torch.") for d in table))
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

    def judge(self, comparison: ErrorMetrics, vs_reference: _ReferencePair | None) -> Judgement:
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

    def judge(self, comparison: ErrorMetrics, vs_reference: _ReferencePair | None) -> Judgement:
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

    def judge(self, comparison: ErrorMetrics, vs_reference: _ReferencePair | None) -> Judgement:
        bad = _nonfinite_failure(comparison)
        if bad is not None:
            return bad
        lim = self.limit(comparison.dtype)
        over, gross = comparison.rule_counts
        share = over / max(comparison.finite_count, 1)
        dtype = str(comparison.dtype).removeprefix("torch.")
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

    def judge(self, comparison: ErrorMetrics, vs_reference: _ReferencePair | None) -> Judgement:
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
        # Baseline errors are floored at one rounding of the reference's scale, so a baseline
        # that matches the reference exactly does not demand an exact target.
        unit = 2.0 ** -FLOAT_FORMATS.get(comparison.dtype, FLOAT_FORMATS[torch.float64])[0]
        floor = unit * max(baseline.expected_rms, math.ldexp(1.0, -1074))
        ratios = {
            "max abs": (target.max_abs_err, baseline.max_abs_err, lim.max_abs_ratio),
            "mean abs": (target.mean_abs_err, baseline.mean_abs_err, lim.mean_abs_ratio),
            "rmse": (target.rmse, baseline.rmse, lim.rmse_ratio),
        }
        values = {k: (t / max(b, floor), limit) for k, (t, b, limit) in ratios.items()}
        shown = ", ".join(f"{k} {r:.3g}x (limit {limit:g})" for k, (r, limit) in values.items())
        worst = max(r / limit for r, limit in values.values())
        if worst <= 1.0:
            return Judgement("pass", f"error vs float64 reference within limits: {shown}")
        if worst <= lim.warn_factor:
            return Judgement("warn", f"error vs float64 reference near limits: {shown}")
        return Judgement("fail", f"error vs float64 reference beyond limits: {shown}")


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

    def judge(self, comparison: ErrorMetrics, vs_reference: _ReferencePair | None) -> Judgement:
        k = comparison.mismatch_count
        if k:
            return Judgement("fail", f"{k} element(s) differ (exact comparison)")
        return Judgement("pass", "all elements equal")


STANDARDS: dict[str, type[Standard]] = {
    cls.name: cls for cls in (AllClose, Ratio, Ulp, Reference, Exact)
}


def _pct(share: float) -> str:
    return f"{100 * share:.4g} %"


@dataclass(frozen=True)
class TensorComparison(ErrorMetrics):
    """:class:`ErrorMetrics` plus the standard applied and its verdict."""

    standard: Standard = field(default_factory=Ratio)
    verdict: Verdict = "pass"
    reason: str = ""
    actual_vs_reference: ErrorMetrics | None = None
    expected_vs_reference: ErrorMetrics | None = None

    @property
    def passed(self) -> bool:
        """True unless the verdict is ``fail`` (a ``warn`` passes, loudly)."""
        return self.verdict != "fail"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary: verdict, standard, dtypes and every scalar metric."""
        out: dict[str, Any] = {
            "verdict": self.verdict,
            "reason": self.reason,
            "standard": self.standard.name,
        }
        for f in fields(ErrorMetrics):
            value = getattr(self, f.name)
            if isinstance(value, torch.dtype):
                value = str(value).removeprefix("torch.")
            elif isinstance(value, NonFinite):
                value = {"nan": value.nan, "posinf": value.posinf, "neginf": value.neginf}
            elif isinstance(value, tuple):
                value = list(value)
            elif isinstance(value, float) and not math.isfinite(value):
                value = str(value)  # JSON has no inf / nan
            out[f.name] = value
        return out


def default_standard(dtype: torch.dtype) -> Standard:
    """Exact for integers and bools, the ratio standard for float dtypes it has tiers for,
    allclose with torch.testing's tolerances otherwise."""
    if not (dtype.is_floating_point or dtype.is_complex):
        return Exact()
    if dtype in RATIO_TIERS:
        return Ratio()
    return AllClose()


def resolve_standard(
    standard: Standard | str | None,
    dtype: torch.dtype,
    *,
    rtol: float | None = None,
    atol: float | None = None,
) -> Standard:
    """Turn the user's ``standard`` / ``rtol`` / ``atol`` into a :class:`Standard`.

    Integers and bools are always compared exactly. For floats, explicit tolerances without a
    standard mean allclose (as in torch.testing); with ``"allclose"`` they override its table;
    with any other standard they are an error.
    """
    tolerances = rtol is not None or atol is not None
    if isinstance(standard, str):
        try:
            cls = STANDARDS[standard]
        except KeyError:
            known = ", ".join(STANDARDS)
            raise PrecisionInputError(f"unknown standard {standard!r} (known: {known})") from None
        standard = cls()
    elif standard is not None and not isinstance(standard, Standard):
        raise PrecisionInputError(
            f"standard must be a name ({', '.join(STANDARDS)}) or a Standard, "
            f"not {type(standard).__name__}"
        )
    if standard is None:
        standard = AllClose() if tolerances else default_standard(dtype)
    elif tolerances and not isinstance(standard, AllClose):
        raise PrecisionInputError(
            f"rtol/atol apply to the allclose standard only, not to {standard.name!r}"
        )
    if not dtype.is_floating_point:
        return Exact()
    if isinstance(standard, AllClose) and tolerances:
        return AllClose(
            rtol=standard.rtol if rtol is None else rtol,
            atol=standard.atol if atol is None else atol,
            table=standard.table,
        )
    return standard


def compare_tensors(
    actual: torch.Tensor,
    expected: torch.Tensor,
    *,
    reference: torch.Tensor | None = None,
    standard: Standard | str | None = None,
    rtol: float | None = None,
    atol: float | None = None,
) -> TensorComparison:
    """Compare two tensors of the same shape and device under a standard, in float64.

    Mixed float dtypes (bf16 target, fp32 golden) are judged by the lower-precision dtype's
    standard. ``reference`` is a float64 computation of the same value, needed by the
    reference standard and reported by every other one.
    """
    dtype = lower_precision(actual.dtype, expected.dtype)
    chosen = resolve_standard(standard, dtype, rtol=rtol, atol=atol)
    return judge_pair(actual, expected, chosen, dtype, reference=reference)


def judge_pair(
    actual: torch.Tensor,
    expected: torch.Tensor,
    standard: Standard,
    dtype: torch.dtype,
    *,
    reference: torch.Tensor | None = None,
) -> TensorComparison:
    """:func:`compare_tensors` with the standard and the dtype it judges by already chosen: a
    dump comparison judges bf16 data that a call upcast to fp32 by the bf16 standard."""
    _check_pair(actual, expected, "expected")
    if reference is not None:
        _check_pair(actual, reference, "reference")
    rule = standard.rule(dtype)
    metrics = measure(actual, expected, rule, dtype=dtype)
    pair: _ReferencePair | None = None
    if reference is not None:
        pair = (
            measure(actual, reference, rule, dtype=dtype),
            measure(expected, reference, rule, dtype=dtype),
        )
    judgement = standard.judge(metrics, pair)
    return TensorComparison(
        **{f.name: getattr(metrics, f.name) for f in fields(metrics)},
        standard=standard,
        verdict=judgement.verdict,
        reason=judgement.reason,
        actual_vs_reference=pair[0] if pair else None,
        expected_vs_reference=pair[1] if pair else None,
    )


def _check_pair(actual: torch.Tensor, other: torch.Tensor, what: str) -> None:
    for t, side in ((actual, "actual"), (other, what)):
        if t.layout != torch.strided:
            raise PrecisionInputError(
                f"{side} is a {t.layout} tensor; convert it with .to_dense() first"
            )
        if t.is_quantized:
            raise PrecisionInputError(f"{side} is quantized; compare .dequantize() instead")
        if t.is_complex():
            raise PrecisionInputError(
                f"{side} is complex ({t.dtype}); compare torch.view_as_real(...) instead"
            )
        if t.device.type == "meta":
            raise PrecisionInputError(f"{side} is on the meta device and holds no values")
    if actual.shape != other.shape:
        raise PrecisionInputError(
            f"shape mismatch: actual {tuple(actual.shape)} vs {what} {tuple(other.shape)}"
        )
    if actual.device != other.device:
        raise PrecisionInputError(
            f"device mismatch: actual on {actual.device}, {what} on {other.device}; "
            f"move one of them (e.g. .cpu()) before comparing"
        )
    if actual.is_floating_point() != other.is_floating_point():
        raise PrecisionInputError(
            f"dtype mismatch: actual {actual.dtype} vs {what} {other.dtype} "
            "(a float can only be compared with a float, an integer with an integer)"
        )


def rounding_envelope(exact: torch.Tensor, dtype: torch.dtype) -> AllClose:
    """How far a correct op computed in ``dtype`` may land from its float64 result: the ratio
    tier's pass tolerance, relative to each element and to the output's RMS (an element
    near zero after cancellation carries the rounding of the large terms that cancelled)."""
    rtol = RATIO_TIERS.get(dtype, RATIO_TIERS[torch.float32]).pass_rtol
    rms = tensor_stats(exact).norm / math.sqrt(max(exact.numel(), 1))
    return AllClose(rtol=rtol, atol=rtol * rms if math.isfinite(rms) else rtol)


def judge_rounding(
    actual: torch.Tensor, exact: torch.Tensor, dtype: torch.dtype
) -> TensorComparison:
    """``actual``, an op's output, judged against the op's float64 result ``exact``: within the
    :func:`rounding_envelope` of ``dtype`` for floats; an index or a mask exactly (a correct op
    reproduces it)."""
    exact = exact.to(actual.device)
    if actual.is_complex():  # real and imaginary parts, each to the rounding of its parts
        actual, exact = torch.view_as_real(actual), torch.view_as_real(exact.to(actual.dtype))
        dtype = actual.dtype
        exact = exact.double()
    if actual.is_floating_point():
        return judge_pair(actual, exact, rounding_envelope(exact, dtype), dtype)
    return judge_pair(actual, exact.to(actual.dtype), Exact(), actual.dtype)
