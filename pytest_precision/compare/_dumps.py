"""``compare_dumps``: align two dumps, compare every matched call, judge the first divergence.

The calls are aligned in :mod:`._alignment`; records are compared in :mod:`._records` and
guilt judged in :mod:`._guilt`. The rules and their causes: ``docs/compare.md``.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import replace
from functools import cached_property
from typing import Literal

import torch

from .._errors import PrecisionInputError
from .._gc import paused_gc
from ..dump._layouts import LayoutRule, MergedLayouts, culprit_ranks, merge_layouts
from ..dump._load import as_dump
from ..dump._records import Call, Dump
from ..numerics._comparison import compare_tensors, resolve_standard
from ..numerics._standards import Reference, Standard, StandardName
from ._alignment import Segment, align, lockstep
from ._growth import error_growth
from ._guilt import GuiltJudge
from ._measurements import Measurements
from ._models import model_mismatch
from ._padding import exclude_padding
from ._precision import RunPrecision
from ._provenance import Provenance, uninitialized_inputs
from ._records import RecordComparer
from ._results import (
    Divergence,
    DumpComparison,
    ModelMismatch,
    PermutedCall,
    UnmatchedCall,
    is_input,
)


def compare_dumps(
    golden: Dump | str | os.PathLike[str],
    target: Dump | str | os.PathLike[str],
    *,
    standard: Standard | StandardName | None = None,
    progress: Callable[[int, int], None] | None = None,
    layouts: Mapping[str, LayoutRule] | None = None,
) -> DumpComparison:
    """Compare two dumps record by record and localize the first divergence.

    Each side is a :class:`Dump` or a path :func:`load_dump` accepts (native, msprobe). Every
    tensor pair is judged by ``standard`` (default: the standard of the lowest precision among
    the call's tensors), statistics-only records by their statistics. ``progress(done, total)``
    is called after each of the target's calls. Two dumps with different numbers of ranks
    (another tensor-parallel size) are each merged into one logical run first; ``layouts``
    names how records matching a pattern are assembled where the shapes cannot tell
    (``docs/compare.md``, which has every rule).
    """
    aligned = AlignedDumps(golden, target, standard=standard, layouts=layouts)
    return walk(aligned, Measurements(standard), progress=progress)


class AlignedDumps:
    """Two dumps, their calls aligned, and what the comparison learns from their metadata
    alone (no tensor is read here): the run's precision, the inputs holding uninitialized
    memory. Shared by the walk and by the workers that measure shards of it."""

    def __init__(
        self,
        golden: Dump | str | os.PathLike[str],
        target: Dump | str | os.PathLike[str],
        *,
        standard: Standard | StandardName | None = None,
        layouts: Mapping[str, LayoutRule] | None = None,
    ) -> None:
        # a bad name fails now, not mid-walk
        if standard is not None and isinstance(
            resolve_standard(standard, torch.float32), Reference
        ):
            raise PrecisionInputError(
                "the reference standard needs a float64 reference of every tensor, which a "
                "dump does not hold; compare dumps with allclose, ratio, ulp or exact"
            )
        self.standard = standard
        self.golden, self.target = as_dump(golden), as_dump(target)
        #: calls paired by content against the runs' order (set with ``segments``)
        self.permuted: list[PermutedCall] = []

        #: set when the two dumps have different numbers of ranks: both merged into one
        self.layouts: MergedLayouts | None = merge_layouts(self.golden, self.target, layouts)
        if self.layouts is not None:
            self.golden, self.target = self.layouts.golden, self.layouts.target
        #: positions the attention mask excludes are not evidence: left out of the records
        self.golden, self.target, self.padding = exclude_padding(self.golden, self.target)

    @cached_property
    def segments(self) -> dict[tuple[int, int], Segment]:
        """Each (step, rank)'s aligned walk, in step then rank order (see :func:`align`)."""
        with paused_gc():  # the calls (grouped on first use) and their alignment
            named = {(c.step, c.rank, c.name): c for c in self.golden.calls}
            by_name = RunPrecision.learn(
                (named[key], c)
                for c in self.target.calls
                if (key := (c.step, c.rank, c.name)) in named
            )
            segments, self.permuted = align(
                self.golden.calls,
                self.target.calls,
                with_dtypes=by_name.golden is not None and not by_name.crosses,
            )
            return segments

    @cached_property
    def model_mismatch(self) -> ModelMismatch | None:
        """Set when the dumps are of different models (see :func:`model_mismatch`)."""
        return model_mismatch(self.golden.calls, self.target.calls)

    @cached_property
    def matched(self) -> list[tuple[Call, Call]]:
        return [(g, t) for pairs, _ in self.segments.values() for g, t in pairs if g is not None]

    def comparer(self, measurements: Measurements, provenance: Provenance) -> RecordComparer:
        """Compares the records of aligned calls, reading tensors through ``measurements``."""
        return RecordComparer(
            self.standard,
            self._precision,
            provenance,
            measurements,
            self._uninitialized,
            # float64 statistics of the same weights agree to the last bits; msprobe's are
            # computed in the tensor's dtype, so only two native dumps can hold weights to that
            exact_weight_stats=self.golden.format == self.target.format == "native",
        )

    @cached_property
    def _precision(self) -> RunPrecision:
        return RunPrecision.learn(self.matched)

    @cached_property
    def _uninitialized(self) -> frozenset[tuple[int, int, str, str]]:
        return uninitialized_inputs(pairs for pairs, _ in self.segments.values())


def walk(
    aligned: AlignedDumps,
    measurements: Measurements,
    *,
    progress: Callable[[int, int], None] | None = None,
) -> DumpComparison:
    """Walk the aligned calls in judging order, compare every record and judge guilt.
    Tensors are read only through ``measurements``: none, where they were measured before."""
    if aligned.model_mismatch is not None:
        return DumpComparison(
            aligned.golden, aligned.target, [], None, different_models=aligned.model_mismatch
        )
    segments = aligned.segments
    target_calls = [t for _, t in aligned.matched]
    provenance = Provenance(target_calls)
    records = aligned.comparer(measurements, provenance)
    judge = GuiltJudge(records, provenance, target_calls, aligned.golden)
    result = DumpComparison(aligned.golden, aligned.target, [], None, permuted=aligned.permuted)
    total = sum(len(pairs) for pairs, _ in segments.values())
    done = 0
    for step_segments in _by_step(segments):
        for (step, rank), (pairs, golden_only) in step_segments:
            result.unmatched.extend(_unmatched("golden", golden_only))
            provenance.remember_golden_only(golden_only)
            judge.unmatched("golden", golden_only)
            if not any(g is not None for g, _ in pairs):
                side = "target" if pairs else "golden"
                result.one_sided.append((side, step, rank, len(pairs) or len(golden_only)))
        for part, collective in lockstep([pairs for _, (pairs, _) in step_segments]):
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
                    result.records.extend(judge.judge_call(g, t, rows, received))
                done += 1
                if progress is not None:
                    progress(done, total)
    found = judge.first_divergence()
    if found is not None:
        growth = error_growth(result.records, found, judge.outputs.gross_limit(found.record))
        found = replace(found, growth=growth)
        if aligned.layouts is not None:
            found = replace(found, ranks=_culprit_ranks(aligned, found))
    result.first_divergence = found
    result.layouts = aligned.layouts
    result.padding = aligned.padding
    result.unverified = judge.unverified
    result.inputs_diverged = judge.inputs_diverged
    result.derived = judge.derived
    return result


def _culprit_ranks(aligned: AlignedDumps, found: Divergence) -> tuple[int, ...]:
    """The target's ranks whose piece of the convicting record differs from the golden's."""
    assert aligned.layouts is not None
    golden = next(
        (
            r
            for r in aligned.golden.records
            if (r.step, r.name, r.slot) == (found.step, found.golden_name, found.record.slot)
        ),
        None,
    )
    return culprit_ranks(
        aligned.layouts,
        (found.step, found.name, found.record.slot),
        None if golden is None else golden.load(),
        lambda target, expected: not compare_tensors(target, expected).passed,
    )


def _by_step(
    segments: dict[tuple[int, int], Segment],
) -> Iterator[list[tuple[tuple[int, int], Segment]]]:
    """The segments of each step, in rank order (``segments`` is in step, then rank order)."""
    for _, group in itertools.groupby(segments.items(), key=lambda item: item[0][0]):
        yield list(group)


def _unmatched(side: Literal["golden", "target"], calls: Iterable[Call]) -> Iterator[UnmatchedCall]:
    for c in calls:
        yield UnmatchedCall(side, c.name, c.module, c.rank, c.step)
