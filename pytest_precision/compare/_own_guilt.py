"""Guilt that a call's own records prove, whatever the rest of the comparison holds.

The first divergence is judged once, by the walk of :mod:`._guilt`, across every shard. A
shard's test cannot wait for that walk, so it fails on what its own calls prove:

- a weight, constant, model input or argument that neither run produced differs;
- a float64 rerun from the call's own recorded inputs differs beyond rounding;
- an op that cannot be rerun received exactly the golden's inputs and put out more than
  rounding.

Each is a rule of the walk, applied only where the walk would apply it with nothing but the
shard at hand: error carried in from another shard (a drifting input, what a collective
gathered from other ranks, statistics inheriting their producer's drift) never convicts. So a
run that differs from its golden only by rounding noise (a bf16 port against fp32) fails no
shard, and a bug fails the shards that hold it, not every shard downstream of it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ..dump._records import Call, Record
from ..numerics._dtypes import dtype_from_name
from ._guilt import failing_inputs, source_reason
from ._outputs import OutputJudge, divergence
from ._provenance import Provenance, fingerprint_of
from ._results import Divergence, RecordComparison, StatsComparison, is_input

#: Content identity within one rank of one dump, as :mod:`._provenance` keys it.
_Content = tuple[int, tuple[object, ...] | None]


class OwnGuilt:
    """Judges one aligned call on its own records. ``target_calls``: every call of the
    target, matched or not; ``golden_only``: the golden's calls the target does not make
    (both from the dumps' index: what any call produced, to tell a source)."""

    def __init__(
        self,
        outputs: OutputJudge,
        provenance: Provenance,
        target_calls: Sequence[Call],
        golden_only: Iterable[Call],
    ) -> None:
        self.outputs = outputs
        self.provenance = provenance
        self.first_step = min((c.step for c in target_calls), default=0)
        self._target_calls = target_calls
        self._golden_only = golden_only
        #: built on the first failing input: a clean shard never needs them
        self._producers: dict[_Content, set[tuple[int, str]]] | None = None
        self._golden_only_producers: dict[_Content, set[tuple[int, str]]] = {}

    def verdict(
        self, golden: Call, target: Call, compared: list[RecordComparison]
    ) -> Divergence | None:
        """The call's guilt in the walk's order (its weights, its inputs, its outputs), where
        its own records prove it; None where proving it needs other calls."""
        for r in compared:
            if r.slot.startswith("parameters") and r.failed:
                return divergence(
                    target, golden, "source", source_reason(self.provenance, r, None), r
                )
        inputs = [r for r in compared if is_input(r.slot)]
        found = self._source(golden, target, inputs)
        if found is not None:
            return found
        failing = [r for r in compared if r.failed and r.slot.startswith("output")]
        if not failing or target.kind == "Module":
            return None  # a module is judged by the ops and modules inside it: other calls
        if self.outputs.measurements.refusal(target) is None:
            return self.outputs.judge_rerun(golden, target, failing)[0]
        if target.kind != "Distributed" and all(_exact(r) for r in inputs):
            return self.outputs.judge_clean_inputs(golden, target, failing)
        return None

    def _source(
        self, golden: Call, target: Call, inputs: list[RecordComparison]
    ) -> Divergence | None:
        """A failing input that no call produced: an argument, or, where ops are recorded, a
        weight, constant or model input (in a module-level dump glue code between modules is
        not recorded, so a tensor may come from it)."""
        for r, record, golden_record in failing_inputs(golden, target, inputs):
            if not record.is_tensor or (
                self.provenance.op_level
                and self._from_nowhere(golden, target, record, golden_record)
                and not self._maybe_new_prompt(target, record)
            ):
                reason = source_reason(self.provenance, r, record)
                return divergence(target, golden, "source", reason, r)
        return None

    def _from_nowhere(
        self, golden: Call, target: Call, record: Record, golden_record: Record | None
    ) -> bool:
        """No other call of the target put out this content, before or after ``target`` (the
        walk asks only before, so this never calls a source what the walk would not), and no
        call only the golden makes put out the golden's (the target lost that call)."""
        if self._producers is None:
            self._producers = _producers(self._target_calls)
            self._golden_only_producers = _producers(self._golden_only)
        others = self._producers.get((target.rank, fingerprint_of(record)), set())
        lost = (golden.rank, fingerprint_of(golden_record)) in self._golden_only_producers
        return others <= {(target.step, target.name)} and not lost  # x.to(x.dtype) is x

    def _maybe_new_prompt(self, target: Call, record: Record) -> bool:
        """Token ids at a later step: the walk blames them only when no earlier step failed
        (else generation took another token), which other shards tell."""
        return not dtype_from_name(record.dtype).is_floating_point and target.step > self.first_step


def _exact(r: RecordComparison) -> bool:
    """An input equal to the golden's; statistics that match may still inherit their
    producer's drift (four statistics miss a permutation), which another shard tells."""
    return r.error_level == 0.0 and not isinstance(r.metrics, StatsComparison)


def _producers(calls: Iterable[Call]) -> dict[_Content, set[tuple[int, str]]]:
    """The calls, as (step, name), that put out each content, by (rank, content) where the
    content is known."""
    out: dict[_Content, set[tuple[int, str]]] = {}
    for call in calls:
        for r in call.outputs:
            if (fingerprint := fingerprint_of(r)) is not None:
                out.setdefault((call.rank, fingerprint), set()).add((call.step, call.name))
    return out
