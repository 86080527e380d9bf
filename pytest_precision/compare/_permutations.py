"""Independent calls the two runs made in another order, paired by content.

Alignment pairs calls of the same signature in order. A model that iterates a ``set`` (Gemma3
computes one rotary embedding per ``set(layer_types)``) makes the same calls in an order that
depends on the process's hash seed: the golden's first rotary ``cos`` is then the target's
second. Among aligned pairs of one signature, a re-pairing is kept where it makes every call it
moves match its new partner far better than its old one (exactly, or ``CLOSER`` times closer),
and no data flows between the calls it moves (none consumes another's output).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence

from ..dump._records import Call, Record
from ._provenance import fingerprint_of

#: a moved call's new partner must be this many times closer than its old one
CLOSER = 10.0
#: how many calls of one signature apart two permuted calls may be (a local reordering)
WINDOW = 8


def repair(
    golden: Sequence[Call],
    target: Sequence[Call],
    signatures: Sequence[Hashable],
    pairs: list[tuple[int, int]],
) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """``pairs`` (golden index, target index) with the permuted calls re-paired by content;
    and the pairs that changed. ``signatures``: the golden calls' alignment signatures."""
    groups: dict[Hashable, list[tuple[int, int]]] = {}
    for g, t in pairs:
        groups.setdefault(signatures[g], []).append((g, t))
    partner = dict(pairs)
    moved: list[tuple[int, int]] = []
    for group in groups.values():
        if len(group) < 2:
            continue
        for g, t in _repaired(golden, target, group):
            partner[g] = t
            moved.append((g, t))
    return sorted(partner.items(), key=lambda p: p[1]), sorted(moved, key=lambda p: p[1])


def _repaired(
    golden: Sequence[Call], target: Sequence[Call], group: list[tuple[int, int]]
) -> list[tuple[int, int]]:
    """The group's pairs that a content match re-pairs (golden index, new target index)."""
    n = len(group)
    same = [distance(golden[g], target[t]) for g, t in group]
    if not any(d > 0.0 for d in same):
        return []
    # greedy assignment by distance within the window: exact and near pairs are taken first;
    # a partner whose first output alone is too far to gain is not measured (a lower bound)
    g_first = [_first_output(golden[g]) for g, _ in group]
    t_first = [_first_output(target[t]) for _, t in group]
    costs = sorted(
        (
            same[i] if i == j else distance(golden[group[i][0]], target[group[j][1]]),
            abs(i - j),
            i,
            j,
        )
        for i in range(n)
        for j in range(max(0, i - WINDOW), min(n, i + WINDOW + 1))
        if i == j or (same[i] > 0.0 and _bound(g_first[i], t_first[j]) * CLOSER < same[i])
    )
    chosen: dict[int, int] = {}
    taken: set[int] = set()
    for cost, _, i, j in costs:
        if i not in chosen and j not in taken and _better(cost, same[i], i == j):
            chosen[i] = j
            taken.add(j)
    # a cycle is kept whole or not at all: every call it moves must have gained
    out: list[tuple[int, int]] = []
    seen: set[int] = set()
    for start in range(n):
        cycle = _cycle(chosen, start)
        if cycle is None or start in seen:
            continue
        seen.update(cycle)
        if len(cycle) > 1 and _independent([target[group[i][1]] for i in cycle]):
            out.extend((group[i][0], group[chosen[i]][1]) for i in cycle)
    return out


def _first_output(call: Call) -> Record | None:
    return call.outputs[0] if call.outputs else None


def _bound(golden: Record | None, target: Record | None) -> float:
    """What two calls' first outputs alone say of their distance (it is at least this)."""
    if golden is None or target is None or golden.slot != target.slot:
        return 0.0
    return _record_distance(golden, target)


def _better(cost: float, same: float, identity: bool) -> bool:
    if identity:
        return True
    return cost * CLOSER < same or (cost == 0.0 and same > 0.0)


def _cycle(chosen: dict[int, int], start: int) -> list[int] | None:
    """The permutation cycle through ``start``; None where the assignment is incomplete."""
    cycle, i = [start], chosen.get(start)
    while i is not None and i != start:
        cycle.append(i)
        i = chosen.get(i)
    return cycle if i == start else None


def _independent(calls: list[Call]) -> bool:
    """No call among ``calls`` received what another of them put out (a call's own output
    may equal its input: ``x * 1.0``)."""
    for c in calls:
        produced = {fingerprint_of(r) for o in calls if o is not c for r in o.outputs} - {None}
        if any(fingerprint_of(r) in produced for r in c.inputs):
            return False
    return True


def distance(golden: Call, target: Call) -> float:
    """How far two calls' recorded contents are apart: the largest difference of any record
    they share, a statistic relative to the tensor's scale (its RMS; its norm for the norm),
    a differing value or checksum 1. 0.0: nothing tells them apart."""
    theirs = {r.slot: r for r in target.records}
    worst = 0.0
    for mine in golden.records:
        other = theirs.get(mine.slot)
        if other is not None:
            worst = max(worst, _record_distance(mine, other))
    return worst


def _record_distance(a: Record, b: Record) -> float:
    if not a.is_tensor or not b.is_tensor:
        return 0.0 if a.is_tensor == b.is_tensor and a.value == b.value else 1.0
    if a.shape != b.shape:
        return 1.0
    if a.stats is None or b.stats is None:
        if a.checksum is None or b.checksum is None:
            return 0.0
        return 0.0 if a.checksum == b.checksum else 1.0
    scale = max(_rms(a.stats.norm, a.stats.numel), _rms(b.stats.norm, b.stats.numel))
    pairs = [
        (a.stats.max, b.stats.max, scale),
        (a.stats.min, b.stats.min, scale),
        (a.stats.mean, b.stats.mean, scale),
        (a.stats.norm, b.stats.norm, max(abs(a.stats.norm), abs(b.stats.norm))),
    ]
    return max(_relative(x, y, s) for x, y, s in pairs)


def _rms(norm: float, numel: int) -> float:
    return abs(norm) / math.sqrt(numel) if numel > 0 and math.isfinite(norm) else 0.0


def _relative(x: float, y: float, scale: float) -> float:
    if x == y or (math.isnan(x) and math.isnan(y)):
        return 0.0
    if not (math.isfinite(x) and math.isfinite(y)) or scale == 0.0:
        return 1.0
    return min(abs(x - y) / scale, 1.0)
