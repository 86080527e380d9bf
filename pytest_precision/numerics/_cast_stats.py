"""Is a tensor's statistics those of the golden's tensor rounded once to a narrower dtype?

A weight of a bf16 model loaded from an fp32 checkpoint (or cast by ``model.to``) is one
round-to-nearest of each element, nothing else. The standard's bf16 tolerance (``2**-7``) is
sized for the drift a computation accumulates, and lets a wrong weight element through (+0.5 on
one of 2048 elements moves the mean by ``2.4e-4``, the norm by less than bf16 holds it). A cast
is far tighter than that:

- rounding to nearest is monotone, so the cast's max and min are exactly the cast of the
  golden's max and min;
- the mean and the norm move by a sum of ``n`` rounding errors ``e_i``, each at most
  ``u |x_i|`` (``u`` the narrower dtype's unit roundoff), and, for weights of distinct values
  (trained or drawn), independent and zero-mean with variance at most ``u**2 x_i**2 / 3``
  (uniform within half an ULP: the probabilistic model of rounding errors of Higham and Mary).
  Bernstein's inequality bounds such a sum by ``sqrt(2 V L) + 2/3 b L`` (``V`` the summed
  variances, ``b`` the largest term, ``L = ln(2 / delta)``), with ``delta`` far below any
  chance of a false alarm. For the norm, ``||x + e||**2 - ||x||**2 = sum (2 x_i e_i + e_i**2)``,
  whose random part has variance at most ``4/3 u**2 peak**2 ||x||**2``;
- a tensor of one value (``max == min``) rounds every element alike: its cast moves the mean by
  exactly that one rounding; a table of a few values repeated (Mamba's ``A_log``, ``log(1..16)``
  in every row) rounds each copy alike, and values within a few ULPs of each other (a trained
  norm's weights near 1) mostly alike: these are held only to ``|e_i| <= u |x_i|``. Only the
  caller knows a tensor's values are distinct (the matrix of a ``linear``, an ``embedding``);
  max and min hold for every tensor;
- the statistics themselves are computed: each side's sum accumulates in float32 at least
  (torch reduces bf16 and fp16 in float32) over a tree of ``log2(n)`` levels, and its result
  is rounded once to the dtype the dump computed it in (the tensor's own in msprobe's dumps).

Subnormals are rounded absolutely: each element's error may also be half the smallest
subnormal, added to every bound.
"""

from __future__ import annotations

import math

import torch

from ._comparison import unit_roundoff
from ._dtypes import precision_bits
from ._stats import TensorStats

#: ``ln(2 / delta)`` of the Bernstein bound: ``delta`` about ``2e-13`` per statistic
CONFIDENCE_LOG = 30.0
#: the errors of a cast average out only over values spread across many ULPs: a tensor whose
#: standard deviation is below this many ULPs of its largest magnitude (a trained norm's
#: weights, all near 1) may round most of its elements the same way
SPREAD_ULPS = 16.0
#: torch's CPU norm keeps this many partial sums at least (vector lanes times unrolling) and
#: adds each term to one of them in turn: its float32 sum of squares of ``n`` terms carries up
#: to ``n / NORM_PARTIAL_SUMS`` roundings of the same sign on a tensor of one value (measured:
#: the norm of 98,304 equal float16 values off by 9e-5, of 4M by 3e-3)
NORM_PARTIAL_SUMS = 16


def narrows(wider: torch.dtype, narrower: torch.dtype) -> bool:
    """Whether casting ``wider`` to ``narrower`` is one rounding of each element that keeps
    every value in range or sends it to infinity: fewer significand bits, no more exponent
    range (float32 or float64 to bfloat16 or float16; float64 to float32)."""
    if not (wider.is_floating_point and narrower.is_floating_point):
        return False
    if wider.is_complex or narrower.is_complex:
        return False
    fewer_bits = precision_bits(narrower) < precision_bits(wider)
    return fewer_bits and torch.finfo(narrower).max <= torch.finfo(wider).max


def not_one_cast(
    golden: TensorStats,
    target: TensorStats,
    golden_dtype: torch.dtype,
    target_dtype: torch.dtype,
    *,
    golden_stats_dtype: torch.dtype,
    target_stats_dtype: torch.dtype,
    distinct: bool,
) -> str | None:
    """Why ``target`` cannot be the statistics of the golden's tensor cast once from
    ``golden_dtype`` to ``target_dtype`` (module docstring); None when it can be, or when no
    claim can be made (no narrowing cast, another size, non-finite values).
    ``*_stats_dtype``: the dtype each dump computed its statistics in; ``distinct``: the
    elements are distinct values (a trained or drawn matrix), whose rounding errors are
    independent; else (a table of a few values repeated, as Mamba's ``A_log``) only the
    deterministic bound holds."""
    if not narrows(golden_dtype, target_dtype) or golden.numel != target.numel:
        return None
    if golden.numel == 0 or not (_finite(golden) and _finite(target)):
        return None
    for name in ("max", "min"):
        g, t = getattr(golden, name), getattr(target, name)
        expected = _cast(g, target_dtype)
        if t != expected:
            return (
                f"{name} {t!r} is not the golden's {g!r} rounded to {_name(target_dtype)} "
                f"({expected!r}): no cast moves an extreme"
            )
    cast = _cast_moves(golden, target_dtype, distinct=distinct)
    golden_own = _computed(golden, golden_stats_dtype)
    target_own = _computed(target, target_stats_dtype)
    allowed = [sum(parts) for parts in zip(cast, golden_own, target_own, strict=True)]
    moved = (abs(target.mean - golden.mean), abs(target.norm - golden.norm))
    for name, by, limit in zip(("mean", "norm"), moved, allowed, strict=True):
        if by > limit:
            return (
                f"{name} moved {by:.3g}, one rounding of each element to "
                f"{_name(target_dtype)} moves it by at most {limit:.3g}"
            )
    return None


def _cast_moves(golden: TensorStats, dtype: torch.dtype, *, distinct: bool) -> tuple[float, float]:
    """How far casting the golden's elements to ``dtype`` may move the mean and the norm."""
    n = golden.numel
    u = unit_roundoff(dtype)
    subnormal = torch.finfo(dtype).tiny * torch.finfo(dtype).eps / 2
    peak = max(abs(golden.max), abs(golden.min))
    norm_g = golden.norm
    if golden.max == golden.min:  # one value: every element rounds alike
        step = abs(_cast(golden.max, dtype) - golden.max)
        return step, math.sqrt(n) * step
    if not distinct or _spread(golden) < SPREAD_ULPS * 2 * u * peak:
        # repeated values, or values within a few ULPs of each other, round alike: no
        # averaging out, only
        # |e_i| <= u |x_i| (sum |x_i| / n <= rms) and ||e|| <= u ||x||
        return u * norm_g / math.sqrt(n) + subnormal, u * norm_g + math.sqrt(n) * subnormal
    # the sum of the errors: variance <= u^2 ||x||^2 / 3, each at most u peak + subnormal
    largest = u * peak + subnormal
    mean = (_bernstein((u * norm_g) ** 2 / 3, largest) + n * subnormal) / n
    # sum 2 x_i e_i: variance <= 4/3 u^2 peak^2 ||x||^2, each at most 2 peak largest; and
    # the subnormals' share and sum e_i^2, deterministic
    squares = _bernstein(4 * (u * peak * norm_g) ** 2 / 3, 2 * peak * largest)
    squares += n * (2 * peak * subnormal + largest**2)
    return mean, squares / norm_g


def _spread(stats: TensorStats) -> float:
    """The standard deviation of the elements (0 where the statistics cannot resolve it)."""
    n = stats.numel
    variance = stats.norm**2 / n - stats.mean**2
    # the statistics' own rounding (float32 at worst) leaves a variance this small unresolved
    unresolved = 8 * unit_roundoff(torch.float32) * math.log2(max(n, 2)) * stats.norm**2 / n
    return math.sqrt(variance) if variance > unresolved else 0.0


def _computed(stats: TensorStats, stats_dtype: torch.dtype) -> tuple[float, float]:
    """How far a dump's own computing of the mean and the norm may be off: accumulated in
    float32 at least (the mean by a tree sum, the sum of squares by ``NORM_PARTIAL_SUMS``
    running sums; half its relative error reaches the norm), then one rounding to
    ``stats_dtype``."""
    accumulate = stats_dtype if precision_bits(stats_dtype) >= 24 else torch.float32
    u_acc, u_out = unit_roundoff(accumulate), unit_roundoff(stats_dtype)
    depth = math.log2(max(stats.numel, 2))
    rms = stats.norm / math.sqrt(stats.numel)
    mean = u_acc * (depth + 1) * rms + u_out * abs(stats.mean)
    running = stats.numel / NORM_PARTIAL_SUMS / 2
    norm = u_acc * (depth + 3 + running) * stats.norm + u_out * stats.norm
    return mean, norm


def _bernstein(variance: float, largest: float) -> float:
    """A bound on a sum of independent zero-mean terms (``variance`` summed, each at most
    ``largest``) exceeded with probability ``2 exp(-CONFIDENCE_LOG)``."""
    return math.sqrt(2 * variance * CONFIDENCE_LOG) + 2 / 3 * largest * CONFIDENCE_LOG


def _cast(value: float, dtype: torch.dtype) -> float:
    return float(torch.tensor(value, dtype=torch.float64).to(dtype).item())


def _finite(s: TensorStats) -> bool:
    counts = s.nan_count + s.posinf_count + s.neginf_count
    return counts == 0 and all(math.isfinite(v) for v in (s.max, s.min, s.mean, s.norm))


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
