"""Inputs derived from a recorded output by calls the dump did not record.

msprobe records about fourteen kinds of call in a transformer (linear, matmul, mul, add,
softmax, ...) and only the outermost of a nest: views, transposes, reshapes, casts, slices,
``cat`` and ``repeat`` never appear. A slice of ``q_proj``'s output reaches the rotary ``mul``
with no recorded producer, though its error is ``q_proj``'s. Before such an input is called a
source, it is matched to the outputs recorded so far by what the unrecorded calls keep:

- ``same elements`` (a view, reshape, transpose, upcast): the same number of elements and the
  same max, min, mean and norm;
- ``same magnitudes`` (some elements negated, a whole rotated by ``rotate_half``): the same
  number of elements, norm and largest magnitude;
- ``part of`` (a slice, split, chunk, possibly negated): a whole fraction of the elements, no
  larger magnitude, no larger norm.

Equal within a few roundings of the narrower dtype (a reduction in another order, a downcast).
A match alone is not enough: the input must also drift no more than the output it is derived
from lets it (``CARRIED`` times that output's error level, scaled by the norm for a part). A
wrong weight that happens to fit inside an activation's range drifts where the activation does
not, and stays a source.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from .._errors import PrecisionError
from ..dump._records import Record
from ..numerics._dtypes import dtype_from_name, precision_bits
from ..numerics._stats import TensorStats

#: how many recorded outputs per rank an input is matched against (the latest first): what
#: an unrecorded view or slice takes is most often put out shortly before
RECENT = 256
#: an input derived from an output may carry this many times that output's error level
CARRIED = 4.0
#: roundings of the narrower dtype that statistics of the same elements may differ by
ROUNDINGS = 4


@dataclass(frozen=True)
class Derivation:
    """Which recorded output an input was derived from, and by which rule."""

    name: str
    slot: str
    rule: str
    #: the error level the output carried (its own, or what its call received)
    level: float

    def describe(self) -> str:
        return f"{self.rule} {self.name}'s {self.slot} (error level {self.level:.3g})"


class RecordedOutputs:
    """The latest recorded outputs of each rank, with the error level each carries."""

    def __init__(self) -> None:
        self._recent: dict[int, deque[tuple[Record, float]]] = {}

    def add(self, record: Record, level: float) -> None:
        if record.stats is not None and record.is_tensor:
            self._recent.setdefault(record.rank, deque(maxlen=RECENT)).append((record, level))

    def derivation(self, record: Record, level: float) -> Derivation | None:
        """The recorded output ``record`` (an input with no recorded producer, at error level
        ``level``) was derived from; None: it matches nothing recorded. The closest rule wins
        (a view of one output before a slice of another), then the latest output."""
        if record.stats is None or not record.is_tensor:
            return None
        found: Derivation | None = None
        for output, carried in reversed(self._recent.get(record.rank, ())):
            rule = relation(record, output)
            if rule is None or (found is not None and _RANK[rule] >= _RANK[found.rule]):
                continue
            assert record.stats is not None
            assert output.stats is not None
            allowed = CARRIED * carried
            if rule == "part of" and record.stats.norm > 0.0:
                allowed *= output.stats.norm / record.stats.norm
            if level <= allowed:
                found = Derivation(output.name, output.slot, rule, carried)
                if rule == _RULES[0]:
                    return found
        return found


#: the rules, closest first
_RULES = ("same elements as", "same magnitudes as", "part of")
_RANK = {rule: i for i, rule in enumerate(_RULES)}


def relation(record: Record, output: Record) -> str | None:
    """How ``record`` may be derived from ``output`` by calls that keep its elements."""
    a, b = record.stats, output.stats
    if a is None or b is None or not (_finite(a) and _finite(b)):
        return None
    if not is_floating(record) or not is_floating(output):
        return None
    rtol = ROUNDINGS * 2.0 ** -min(_bits(record), _bits(output))
    scale = max(_rms(a), _rms(b))
    if a.numel == b.numel:
        if _close(a.norm, b.norm, rtol * b.norm) and _close(_peak(a), _peak(b), rtol * scale):
            same = all(_close(x, y, rtol * scale) for x, y in ((a.max, b.max), (a.min, b.min)))
            if same and _close(a.mean, b.mean, rtol * scale):
                return "same elements as"
            return "same magnitudes as"
        return None
    if 0 < a.numel < b.numel and b.numel % a.numel == 0:
        fits = _peak(a) <= _peak(b) + rtol * scale and a.norm <= b.norm * (1 + rtol)
        return "part of" if fits else None
    return None


def _finite(s: TensorStats) -> bool:
    counts = s.nan_count + s.posinf_count + s.neginf_count
    return counts == 0 and all(math.isfinite(v) for v in (s.max, s.min, s.mean, s.norm))


def is_floating(record: Record) -> bool:
    """A floating dtype (one this torch does not know makes no claim about its elements)."""
    try:
        return dtype_from_name(record.dtype).is_floating_point
    except PrecisionError:  # a dtype this torch does not know: no claim about its elements
        return False


def _bits(record: Record) -> int:
    return precision_bits(dtype_from_name(record.dtype))


def _rms(s: TensorStats) -> float:
    return s.norm / math.sqrt(s.numel) if s.numel > 0 else 0.0


def _peak(s: TensorStats) -> float:
    return max(abs(s.max), abs(s.min))


def _close(x: float, y: float, tolerance: float) -> bool:
    return abs(x - y) <= tolerance
