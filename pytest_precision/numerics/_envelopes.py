"""Standards for values that came out of many ops (a decoder layer, the logits).

A multi-op value in bf16 / fp16 carries hundreds of roundings, so the default ratio standard
(one rounding) fails honest ports. These standards judge such a value against its noise
envelope instead: :class:`ModelLevel` (a fixed rule in units of the dtype's unit roundoff, when
nothing was measured), :class:`Spread` (the spread of legitimate reruns measured at record
time), and :func:`envelope_excess`, how far any verdict sits from its limit (1.0 = on it).
Measured in docs/standards.md ("Multi-op values").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from ._dtypes import precision_bits
from ._measure import ElementRule, ErrorMetrics
from ._standards import (
    ALLCLOSE_TOLERANCES,
    Judgement,
    Reference,
    ReferencePair,
    Standard,
    StandardName,
    _allclose_rule,
    _nonfinite_failure,
    reference_ratios,
)

#: Model-level rule: RMSE / RMS(golden) and max abs error / max |golden|, in unit roundoffs.
#: Honest ports reached at most 0.62 of these over 4 models x 2 dtypes x 3 init scales.
MODEL_RMSE_UNITS = 32.0
MODEL_MAX_UNITS = 128.0

#: A perturbation envelope admits this many times the recorded spread (c = 2 gave 11-36 false
#: alarms per 1400 honest comparisons when a held-out path was noisier than every recorded one).
SPREAD_FACTOR = 4.0

_TINY = math.ldexp(1.0, -1074)


def unit_roundoff(dtype: torch.dtype) -> float:
    """``u``: half the spacing of the dtype's floats at 1 (bf16 2^-8, fp16 2^-11)."""
    return 2.0 ** -precision_bits(dtype)


class _EnvelopeStandard(Standard):
    """Shared parts: elementwise counts use torch.testing's tolerances (reported only)."""

    def tolerances(self, dtype: torch.dtype) -> tuple[float, float]:
        return ALLCLOSE_TOLERANCES.get(dtype, (0.0, 0.0))

    def rule(self, dtype: torch.dtype) -> ElementRule:
        return _allclose_rule(*self.tolerances(dtype))

    def scores(self, comparison: ErrorMetrics) -> dict[str, tuple[float, float]]:
        raise NotImplementedError

    def judge(self, comparison: ErrorMetrics, vs_reference: ReferencePair | None) -> Judgement:
        bad = _nonfinite_failure(comparison)
        if bad is not None:
            return bad
        values = self.scores(comparison)
        shown = ", ".join(f"{k} {v:.3g} (limit {lim:.3g})" for k, (v, lim) in values.items())
        if all(v <= lim for v, lim in values.values()):
            return Judgement("pass", f"within the {self.what}: {shown}")
        return Judgement("fail", f"beyond the {self.what}: {shown}")

    what = "envelope"


@dataclass(frozen=True)
class ModelLevel(_EnvelopeStandard):
    """``rmse <= rmse_units * u * rms(golden)`` and ``max abs <= max_units * u * max|golden|``.

    For multi-op goldens without a float64 reference. ``expected_max_abs`` is the golden's
    largest magnitude (the metrics carry its RMS, not its maximum).
    """

    expected_max_abs: float
    rmse_units: float = MODEL_RMSE_UNITS
    max_units: float = MODEL_MAX_UNITS
    name: ClassVar[StandardName] = "model"
    what = "model-level envelope"

    def scores(self, comparison: ErrorMetrics) -> dict[str, tuple[float, float]]:
        u = unit_roundoff(comparison.dtype)
        return {
            "rmse/rms(golden) in u": (
                comparison.rmse / max(comparison.expected_rms, _TINY) / u,
                self.rmse_units,
            ),
            "max abs/max|golden| in u": (
                comparison.max_abs_err / max(self.expected_max_abs, _TINY) / u,
                self.max_units,
            ),
        }


@dataclass(frozen=True)
class Spread(_EnvelopeStandard):
    """RMSE and max abs error against the golden within absolute limits (a measured spread
    times :data:`SPREAD_FACTOR`, already applied)."""

    rmse: float
    max_abs: float
    name: ClassVar[StandardName] = "spread"
    what = "perturbation envelope"

    def scores(self, comparison: ErrorMetrics) -> dict[str, tuple[float, float]]:
        return {
            "rmse": (comparison.rmse, self.rmse),
            "max abs": (comparison.max_abs_err, self.max_abs),
        }


def envelope_excess(
    standard: Standard, comparison: ErrorMetrics, vs_reference: ReferencePair | None
) -> float | None:
    """The worst metric over its limit (> 1 fails); None for standards without a scalar one."""
    if isinstance(standard, _EnvelopeStandard):
        return max(
            (v / lim if lim > 0 else (math.inf if v > 0 else 0.0))
            for v, lim in standard.scores(comparison).values()
        )
    if isinstance(standard, Reference) and vs_reference is not None:
        ratios = reference_ratios(comparison.dtype, *vs_reference, standard.limit())
        return max(r / lim for r, lim in ratios.values())
    return None
