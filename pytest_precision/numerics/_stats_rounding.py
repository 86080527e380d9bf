"""How far the statistics of one op's output may move between two correct implementations.

A statistics dump holds max, min, mean and norm, no elements. When an op received exactly the
golden's inputs, its output may differ from the golden's only by the rounding of its own
computation, not by the drift a layer accumulates: the ``1e-4`` of the fp32 standard lets a
changed formula through (tanh-approximated GELU against exact GELU moves the output norm by
about ``4e-5`` relative; two correct fp32 implementations move it by ``4.8e-7`` at most).

The bound, per statistic, for a tensor ``y`` of ``n`` elements in a dtype of unit roundoff ``u``:

- every element may be off by ``ELEMENT_ROUNDINGS * u * (|y_i| + rms)``: two implementations
  each within one ULP (two roundings) of the exact value, where an element near zero after
  cancellation (GELU's negative tail, ``1 + erf``) carries the rounding of the larger terms
  that cancelled (the rerun envelope's convention); an op that sums ``terms`` values per
  element (a softmax's row, a norm's hidden size) adds ``REDUCTION_ROUNDINGS * u * (terms -
  1) * |y_i|``, the first-order rounding of another summation order relative to its terms
  (all of one sign in a softmax or a variance, so no larger than the result);
- a contraction (``linear``, ``matmul``, ``sum``) whose terms may cancel is also off by
  ``REDUCTION_ROUNDINGS * u * S_i`` per element, ``S_i`` the magnitude of its terms (the rerun
  envelope's reordering term); ``||S||`` is bounded by the norms of the inputs
  (``||x|| * ||w||`` for a product), so ``||dy|| <= REDUCTION_ROUNDINGS * u * terms_norm``;
- max and min move by at most the largest element change at their magnitude; the mean by at
  most the mean element change (``sum |y_i| / n <= rms`` by Cauchy-Schwarz); the norm by at
  most the norm of the change (``||(|y_i| + rms)|| <= 2 ||y||``);
- the statistics themselves are sums: computed in a dtype of unit roundoff ``u_s`` (float64 in
  native dumps, the tensor's dtype in msprobe's) by a tree or cascade reduction (torch's), each
  side's sum is off by up to ``u_s * log2(n)`` of its terms' magnitude: the two means may differ
  by ``2 u_s (log2(n) + 1)`` of the RMS, the two norms by ``u_s (log2(n) + 3)`` of the norm.

Each bound is a worst case (every element's rounding aligned); a changed formula moves the
statistics systematically, correct implementations move them like a random walk, far inside.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ._comparison import REDUCTION_ROUNDINGS, unit_roundoff
from ._stats import TensorStats

#: Roundings per element that two correct implementations of an elementwise op may differ by:
#: each within one ULP (two unit roundoffs) of the exact value (a vectorized ``exp`` or ``erf``
#: is not correctly rounded).
ELEMENT_ROUNDINGS = 4.0

#: The four statistics, in the order the report names them.
STATISTICS = ("max", "min", "mean", "norm")


@dataclass(frozen=True)
class StatScales:
    """What each statistic's difference is relative to: the golden's value, but never less
    than the tensor's RMS (a mean or a max near zero has no useful relative error)."""

    max: float
    min: float
    mean: float
    norm: float

    @classmethod
    def of(cls, golden: TensorStats) -> StatScales:
        rms = golden.norm / math.sqrt(golden.numel) if golden.numel else 0.0
        floor = rms if rms > 0 and math.isfinite(rms) else 1.0
        return cls(
            max=_at_least(abs(golden.max), floor),
            min=_at_least(abs(golden.min), floor),
            mean=floor,
            norm=golden.norm if golden.norm > 0 else 1.0,
        )


@dataclass(frozen=True)
class OneRounding:
    """How far each statistic of an op's output may move, relative to :class:`StatScales`."""

    max: float
    min: float
    mean: float
    norm: float

    def beyond(self, golden: TensorStats, target: TensorStats) -> tuple[str, float, float] | None:
        """The statistic that moved most beyond its allowance: (name, relative move, relative
        allowance); None when every one is within (non-finite values are judged elsewhere)."""
        scales = StatScales.of(golden)
        worst: tuple[str, float, float] | None = None
        for name in STATISTICS:
            g, t = getattr(golden, name), getattr(target, name)
            if g == t or not (math.isfinite(g) and math.isfinite(t)):
                continue
            moved, allowed = abs(t - g) / getattr(scales, name), getattr(self, name)
            if moved > allowed and (worst is None or moved / allowed > worst[1] / worst[2]):
                worst = (name, moved, allowed)
        return worst


def one_rounding(
    golden: TensorStats,
    target: TensorStats,
    dtype: torch.dtype,
    *,
    terms: int = 1,
    terms_norm: float = 0.0,
    stats_dtype: torch.dtype = torch.float64,
) -> OneRounding:
    """What one rounding of ``dtype`` may move the statistics of an op's output (module
    docstring). ``terms``: the values each output element sums (1 for an elementwise op);
    ``terms_norm``: for a contraction, a bound on the norm of its terms' magnitudes;
    ``stats_dtype``: the dtype the dumps computed their statistics in."""
    u = unit_roundoff(dtype)
    own = ELEMENT_ROUNDINGS * u  # relative to |y_i| + rms
    summing = REDUCTION_ROUNDINGS * u * max(terms - 1, 0)  # relative to |y_i|
    spread = REDUCTION_ROUNDINGS * u * terms_norm if math.isfinite(terms_norm) else math.inf
    n = max(golden.numel, 1)
    # each side's tree sum is off by u_s log2(n) of its terms (here |y_i| <= rms, y_i^2), a
    # mean by one more rounding (the division), a norm by half its sum's plus the squares'
    # and the square root's
    u_s, depth = unit_roundoff(stats_dtype), math.log2(n)
    mean_sum, norm_sum = 2 * u_s * (depth + 1), u_s * (depth + 3)
    # near zero a value is rounded to a multiple of the smallest subnormal, not relatively
    underflow = ELEMENT_ROUNDINGS * torch.finfo(dtype).tiny * u
    norm = max(golden.norm, target.norm)
    rms = norm / math.sqrt(n)
    scales = StatScales.of(golden)

    def extreme(name: str) -> float:
        value = max(abs(getattr(golden, name)), abs(getattr(target, name)))
        return (own * (value + rms) + summing * value + spread + underflow) / getattr(scales, name)

    # sum |y_i| / n <= rms and ||(|y_i| + rms)|| <= 2 ||y||
    element = 2 * own + summing
    return OneRounding(
        max=extreme("max"),
        min=extreme("min"),
        mean=((element + mean_sum) * rms + spread / math.sqrt(n) + underflow) / scales.mean,
        norm=((element + norm_sum) * norm + spread + underflow) / scales.norm,
    )


def _at_least(value: float, floor: float) -> float:
    return value if value > floor and math.isfinite(value) else floor
