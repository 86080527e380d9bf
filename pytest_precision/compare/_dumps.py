"""``compare_dumps``: align two dumps, compare every matched call, judge the first divergence.

The calls are aligned in :mod:`._alignment`; records are compared in :mod:`._records` and
guilt judged in :mod:`._guilt`. The rules and their causes: ``docs/compare.md``.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from typing import Literal

import torch

from .._errors import PrecisionInputError
from ..dump._load import as_dump
from ..dump._records import Call, Dump
from ..numerics._comparison import resolve_standard
from ..numerics._standards import Reference, Standard, StandardName
from ._alignment import Segment, align, lockstep
from ._growth import error_growth
from ._guilt import GuiltJudge
from ._precision import RunPrecision
from ._provenance import Provenance
from ._records import RecordComparer
from ._results import DumpComparison, UnmatchedCall, is_input


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
    for step_segments in _by_step(segments):
        for (step, rank), (walk, golden_only) in step_segments:
            result.unmatched.extend(_unmatched("golden", golden_only))
            provenance.remember_golden_only(golden_only)
            judge.unmatched("golden", golden_only)
            if not any(g is not None for g, _ in walk):
                side = "target" if walk else "golden"
                result.one_sided.append((side, step, rank, len(walk) or len(golden_only)))
        for part, collective in lockstep([walk for _, (walk, _) in step_segments]):
            compared = [records.compare_call(g, t) if g is not None else [] for g, t in part]
            # what the ranks fed into a collective reaches every rank's output of it
            fed = (r.error_level for rows in compared for r in rows if is_input(r.slot))
            received = max(fed, default=0.0) if collective else 0.0
            for (g, t), rows in zip(part, compared, strict=True):
                if g is None:
                    result.unmatched.extend(_unmatched("target", [t]))
                    provenance.remember_unmatched(t)
                    judge.unmatched("target", [t])
                else:
                    result.matched_calls += 1
                    result.records.extend(rows)
                    judge.judge_call(g, t, rows, received)
                done += 1
                if progress is not None:
                    progress(done, total)
    found = judge.first_divergence()
    if found is not None:
        growth = error_growth(result.records, found, judge.outputs.gross_limit(found.record))
        found = replace(found, growth=growth)
    result.first_divergence = found
    result.unverified = judge.unverified
    result.inputs_diverged = judge.inputs_diverged
    return result


def _by_step(
    segments: dict[tuple[int, int], Segment],
) -> Iterator[list[tuple[tuple[int, int], Segment]]]:
    """The segments of each step, in rank order (``segments`` is in step, then rank order)."""
    for _, group in itertools.groupby(segments.items(), key=lambda item: item[0][0]):
        yield list(group)


def _unmatched(side: Literal["golden", "target"], calls: Iterable[Call]) -> Iterator[UnmatchedCall]:
    for c in calls:
        yield UnmatchedCall(side, c.name, c.module, c.rank, c.step)
