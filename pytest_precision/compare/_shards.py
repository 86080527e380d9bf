"""A dump comparison in parts: shards measured anywhere, one walk that judges them all.

A shard is the target's calls of one decode step, one rank and one decoder layer (the calls
outside every layer make one shard per step and rank). Measuring a shard reads only the
tensors of its calls and returns the records it compared, the calls its own records prove
guilty (:mod:`._own_guilt`), and its measurements as plain data; the walk that judges the first
divergence needs the order of every shard (an error crosses layers and, through collectives,
ranks), so it runs once, on the merged measurements, reading no tensor. Serial or spread over
machines, it is the same walk on the same measurements: the same report.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from ..dump._records import Call, Dump
from ..numerics._standards import Standard, StandardName
from ._dumps import AlignedDumps, walk
from ._measurements import Measurements
from ._outputs import OutputJudge
from ._own_guilt import OwnGuilt
from ._provenance import Provenance, fingerprint_of
from ._records import RecordComparer
from ._results import Divergence, DumpComparison, RecordComparison, is_input, layer_of

#: The name of the shard of calls outside every decoder layer.
OUTSIDE_LAYERS = "outside-layers"


@dataclass(frozen=True)
class Shard:
    """The target's calls of one decode step and rank inside one decoder layer
    (``model.layers.3``); ``layer`` None: the calls outside every layer."""

    step: int
    rank: int
    layer: str | None

    @property
    def id(self) -> str:
        """``step0-rank3-model.layers.2``: unique within a comparison, stable across runs."""
        return f"step{self.step}-rank{self.rank}-{self.layer or OUTSIDE_LAYERS}"


@dataclass(frozen=True)
class ShardResult:
    """What measuring one shard gave: its compared records, the calls its own records prove
    guilty, and its measurements as plain data for :meth:`ShardedComparison.merge`
    (``json.dumps`` writes them)."""

    shard: Shard
    records: list[RecordComparison]
    payload: dict[str, list[list[Any]]]
    #: the shard's calls guilty on their own records, in walk order: what fails its test (a
    #: record failing the standard may only carry error made in another shard)
    culprits: list[Divergence]

    @property
    def failed(self) -> list[RecordComparison]:
        """The records that fail the standard."""
        return [r for r in self.records if r.failed]


class ShardedComparison:
    """:func:`compare_dumps` in parts. Every process that takes part builds one from the same
    dumps (reading their index, no tensor); workers ``measure`` shards, the process that
    judges ``merge``\\ s their payloads and calls ``result()``, which gives the report
    ``compare_dumps`` gives. A shard nobody measured is measured by ``result()`` itself."""

    def __init__(
        self,
        golden: Dump | str | os.PathLike[str],
        target: Dump | str | os.PathLike[str],
        *,
        standard: Standard | StandardName | None = None,
    ) -> None:
        self.aligned = AlignedDumps(golden, target, standard=standard)
        self.measurements = Measurements(standard)

    @cached_property
    def shards(self) -> list[Shard]:
        """Every shard, in step and rank order, layers in the order the target ran them;
        from the target's index alone (no alignment, no tensor)."""
        found = dict.fromkeys(
            Shard(c.step, c.rank, layer_of(c.module)) for c in self.aligned.target.calls
        )
        return sorted(found, key=lambda s: (s.step, s.rank))

    def shard_of(self, step: int, rank: int, name: str) -> Shard:
        """The shard holding the target's call ``name`` at ``step`` and ``rank``."""
        call = next(
            c for c in self.aligned.target.calls if (c.step, c.rank, c.name) == (step, rank, name)
        )
        return Shard(step, rank, layer_of(call.module))

    def measure(self, shard: Shard) -> ShardResult:
        """Compare the calls of ``shard``, measure ahead of the walk the reruns and rounding
        checks it may ask for there, and judge each call on its own records. Reads only the
        tensors of the shard's calls."""
        records: list[RecordComparison] = []
        culprits: list[Divergence] = []
        if self.aligned.model_mismatch is not None:  # dumps of different models: no culprit
            return ShardResult(shard, records, self.measurements.payload(), culprits)
        judge = self._own_guilt.in_shard()
        for golden, target in self.pairs(shard):
            rows = self._comparer.compare_call(golden, target)
            records.extend(rows)
            self._measure_ahead(golden, target, rows)
            if (found := judge.verdict(golden, target, rows)) is not None:
                culprits.append(found)
        return ShardResult(shard, records, self.measurements.payload(), culprits)

    def pairs(self, shard: Shard) -> list[tuple[Call, Call]]:
        """The aligned (golden, target) call pairs of ``shard``, in walk order: what measuring
        it reads (their records' stored tensors)."""
        pairs = self._pairs.get(shard)
        if pairs is None:
            raise KeyError(f"no shard {shard.id} in this comparison")
        return pairs

    def merge(self, payload: dict[str, list[list[Any]]]) -> None:
        """Take in the measurements of a shard measured elsewhere."""
        self.measurements.merge(payload)

    def result(self, *, progress: Callable[[int, int], None] | None = None) -> DumpComparison:
        """The comparison of the whole dumps, judged on the measurements at hand;
        ``self.measurements.computed`` grows by what it had to measure itself."""
        return walk(self.aligned, self.measurements, progress=progress)

    # -- measuring ahead -------------------------------------------------------------------------

    @cached_property
    def _pairs(self) -> dict[Shard, list[tuple[Call, Call]]]:
        """The matched call pairs of each shard, in walk order."""
        out: dict[Shard, list[tuple[Call, Call]]] = {shard: [] for shard in self.shards}
        for pairs, _ in self.aligned.segments.values():
            for golden, target in pairs:
                if golden is not None:
                    shard = Shard(target.step, target.rank, layer_of(target.module))
                    out[shard].append((golden, target))
        return out

    @cached_property
    def _provenance(self) -> Provenance:
        # only what needs no walk is used here: the op level, the parameters' names
        return Provenance([t for _, t in self.aligned.matched])

    @cached_property
    def _comparer(self) -> RecordComparer:
        return self.aligned.comparer(self.measurements, self._provenance)

    @cached_property
    def _outputs(self) -> OutputJudge:
        return OutputJudge(self._comparer.precision, self._provenance, self.measurements)

    @cached_property
    def _own_guilt(self) -> OwnGuilt:
        golden_only = [g for _, only in self.aligned.segments.values() for g in only]
        return OwnGuilt(self._outputs, self._provenance, self.aligned.target.calls, golden_only)

    @cached_property
    def _foreign(self) -> set[tuple[str, int, object]]:
        """Contents, by (side, rank, fingerprint), that calls only one run makes produced."""
        out: set[tuple[str, int, object]] = set()
        for pairs, golden_only in self.aligned.segments.values():
            unmatched = [t for g, t in pairs if g is None]
            for side, calls in (("target", unmatched), ("golden", golden_only)):
                for call in calls:
                    for r in call.outputs:
                        if (fingerprint := fingerprint_of(r)) is not None:
                            out.add((side, call.rank, fingerprint))
        return out

    def _measure_ahead(self, golden: Call, target: Call, rows: list[RecordComparison]) -> None:
        """What the walk may ask about this pair, a superset of it: the rerun of an op whose
        output fails (else the rounding checks of its outputs, when its inputs match
        exactly), and the rounding checks of failing inputs that code only one run produced.
        What it asks beyond that (rare: a wiring check, what leaves a module of rewritten
        code) it measures itself."""
        outputs = self._outputs
        failing = [r for r in rows if r.failed and r.slot.startswith("output")]
        if failing and target.kind != "Module":
            if self.measurements.refusal(target) is None:
                for r in failing:
                    if self.measurements.rerun_check(target, r.slot).refused:
                        break
            elif all(r.error_level == 0.0 for r in rows if is_input(r.slot)):
                for r in failing:
                    outputs.beyond_rounding(golden, target, r)
        golden_records = {r.slot: r for r in golden.records}
        target_records = {r.slot: r for r in target.records}
        for r in rows:
            if not (r.failed and is_input(r.slot)):
                continue
            produced = (
                ("target", target.rank, fingerprint_of(target_records.get(r.slot))),
                ("golden", golden.rank, fingerprint_of(golden_records.get(r.slot))),
            )
            if any(content in self._foreign for content in produced):
                outputs.beyond_rounding(golden, target, r)
