"""Two tensors compared under a standard: :class:`TensorComparison` (every float64 metric plus a
verdict and its reason), ``compare_tensors``, and the rounding envelope that compare and replay
judge reruns with."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from typing import Any

import torch

from .._errors import PrecisionInputError
from ._dtypes import dtype_name, lower_precision
from ._measure import ErrorMetrics, NonFinite, measure
from ._standard_names import STANDARDS
from ._standards import (
    RATIO_TIERS,
    AllClose,
    Exact,
    Ratio,
    ReferencePair,
    Standard,
    Verdict,
)
from ._stats import tensor_stats


class ShapeMismatch(PrecisionInputError):
    """The two sides have different shapes: ``assert_close`` reports it as an assertion
    failure (a result of the wrong shape is a wrong result, as in torch.testing)."""


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
                value = dtype_name(value)
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
    standard = standard.bind(actual, expected)
    rule = standard.rule(dtype)
    metrics = measure(actual, expected, rule, dtype=dtype)
    pair: ReferencePair | None = None
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
        raise ShapeMismatch(
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


#: How many unit roundoffs of the magnitude of its terms a contraction's output may carry beyond
#: the elementwise envelope: the rounding of another accumulation order (split-K with
#: low-precision partial sums, another blocking), measured and justified in docs/compare.md.
REDUCTION_ROUNDINGS = 2.0


def unit_roundoff(dtype: torch.dtype) -> float:
    """Half the machine epsilon of ``dtype``: the largest relative error of one rounding."""
    return torch.finfo(dtype).eps / 2


def judge_rounding(
    actual: torch.Tensor,
    exact: torch.Tensor,
    dtype: torch.dtype,
    *,
    magnitude: torch.Tensor | None = None,
) -> TensorComparison:
    """``actual``, an op's output, judged against the op's float64 result ``exact``: within the
    :func:`rounding_envelope` of ``dtype`` for floats; an index or a mask exactly (a correct op
    reproduces it). ``magnitude``: for a contraction, the float64 sum of the magnitudes of the
    terms of each element (``|x| @ |w|^T``); a correct kernel that accumulates in another order
    may also be off by ``REDUCTION_ROUNDINGS * u * magnitude`` (``u`` of ``dtype``), which where
    the sum cancels is far more than the rounding of the result."""
    exact = exact.to(actual.device)
    if actual.is_complex():  # real and imaginary parts, each to the rounding of its parts
        actual, exact = torch.view_as_real(actual), torch.view_as_real(exact.to(actual.dtype))
        dtype = actual.dtype
        exact = exact.double()
        magnitude = None
    if not actual.is_floating_point():
        return judge_pair(actual, exact.to(actual.dtype), Exact(), actual.dtype)
    envelope = rounding_envelope(exact, dtype)
    judged = judge_pair(actual, exact, envelope, dtype)
    if magnitude is None or judged.verdict != "fail" or judged.nonfinite_mismatch_count:
        return judged
    if tuple(magnitude.shape) != tuple(exact.shape):
        return judged
    return _within_reordering(actual, exact, envelope, magnitude.to(exact.device), judged)


def _within_reordering(
    actual: torch.Tensor,
    exact: torch.Tensor,
    envelope: AllClose,
    magnitude: torch.Tensor,
    judged: TensorComparison,
) -> TensorComparison:
    """``judged`` (beyond the elementwise envelope) judged again with the reordering allowance
    of a contraction added to each element's atol; the metrics stay those of the pair."""
    rtol, atol = envelope.tolerances(judged.dtype)
    a, e = actual.double(), exact.double()
    reorder = REDUCTION_ROUNDINGS * unit_roundoff(judged.dtype)
    bound = atol + rtol * e.abs() + reorder * magnitude.double()
    finite = a.isfinite() & e.isfinite()
    beyond = int(((a - e).abs() > bound)[finite].sum())
    rule = f"atol + rtol * |expected| + {REDUCTION_ROUNDINGS:g} * u * |terms| (rtol={rtol:g}, "
    rule += f"atol={atol:g}, u={reorder / REDUCTION_ROUNDINGS:g})"
    if beyond:
        verdict: Verdict = "fail"
        reason = f"{beyond} element(s) exceed {rule}"
    else:
        verdict, reason = "pass", f"all elements within {rule}: another accumulation order"
    return replace(
        judged, verdict=verdict, reason=reason, mismatch_count=beyond, rule_counts=(beyond,)
    )
