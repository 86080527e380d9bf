"""``compare_dumps``: align two dumps, compare every matched call, judge the first divergence.

The calls are aligned in :mod:`._alignment`; records are compared in :mod:`._records` and
guilt judged in :mod:`._guilt`. The rules and their causes: ``docs/compare.md``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from typing import Literal

import torch

from .._errors import PrecisionInputError
from ..dump._load import as_dump
from ..dump._records import Call, Dump
from ..numerics._comparison import resolve_standard
from ..numerics._standards import Reference, Standard, StandardName
from ._alignment import align
from ._guilt import GuiltJudge
from ._precision import RunPrecision
from ._provenance import Provenance
from ._records import RecordComparer
from ._results import DumpComparison, UnmatchedCall


def compare_dumps(
    golden: Dump | str | os.PathLike[str],
    target: Dump | str | os.PathLike[str],
    *,
    standard: Standard | StandardName | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> DumpComparison:
    """Compare two dumps record by record and localize the first divergence.

    Each side is a :class:`Dump` or a path :func:`load_dump` accepts (native, msprobe). Every
    tensor pair is judged by ``standard`` (default: the standard of the lowest precision among
    the call's tensors), statistics-only records by their statistics. ``progress(done, total)``
    is called after each of the target's calls. See ``docs/compare.md`` for the rules.
    """
    # a bad name fails now, not mid-walk
    if standard is not None and isinstance(resolve_standard(standard, torch.float32), Reference):
        raise PrecisionInputError(
            "the reference standard needs a float64 reference of every tensor, which a "
            "dump does not hold; compare dumps with allclose, ratio, ulp or exact"
        )
    golden_dump, target_dump = as_dump(golden), as_dump(target)
    named = {(c.step, c.rank, c.name): c for c in golden_dump.calls}
    by_name = RunPrecision.learn(
        (named[key], c) for c in target_dump.calls if (key := (c.step, c.rank, c.name)) in named
    )
    segments = align(
        golden_dump.calls,
        target_dump.calls,
        with_dtypes=by_name.golden is not None and not by_name.crosses,
    )
    matched = [(g, t) for walk, _ in segments.values() for g, t in walk if g is not None]
    target_calls = [t for _, t in matched]
    provenance = Provenance(target_calls)
    records = RecordComparer(
        standard,
        RunPrecision.learn(matched),
        provenance,
        # float64 statistics of the same weights agree to the last bits; msprobe's are
        # computed in the tensor's dtype, so only two native dumps can hold weights to that
        exact_weight_stats=golden_dump.format == target_dump.format == "native",
    )
    judge = GuiltJudge(records, provenance, target_calls, golden_dump)
    result = DumpComparison(golden_dump, target_dump, [], None)
    total = sum(len(walk) for walk, _ in segments.values())
    done = 0
    for (step, rank), (walk, golden_only) in segments.items():
        result.unmatched.extend(_unmatched("golden", golden_only))
        provenance.remember_golden_only(golden_only)
        if not any(g is not None for g, _ in walk):
            side = "target" if walk else "golden"
            result.one_sided.append((side, step, rank, len(walk) or len(golden_only)))
        for g, t in walk:
            if g is None:
                result.unmatched.extend(_unmatched("target", [t]))
                provenance.remember_unmatched(t)
                judge.track(t)
            else:
                result.matched_calls += 1
                compared = records.compare_call(g, t)
                result.records.extend(compared)
                judge.judge_call(g, t, compared)
            done += 1
            if progress is not None:
                progress(done, total)
    result.first_divergence = judge.first_divergence()
    result.unverified = judge.unverified
    result.inputs_diverged = judge.inputs_diverged
    return result


def _unmatched(side: Literal["golden", "target"], calls: Iterable[Call]) -> Iterator[UnmatchedCall]:
    for c in calls:
        yield UnmatchedCall(side, c.name, c.module, c.rank, c.step)
