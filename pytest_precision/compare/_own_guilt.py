"""Guilt that a call's own records prove, whatever the rest of the comparison holds.

The first divergence is judged once, by the walk of :mod:`._guilt`, across every shard. A
shard's test cannot wait for that walk, so it fails on what its own calls prove:

- a stomp that capture recorded (see :mod:`._stomps`);
- a weight differs; at the first decode step, a constant, model input or argument that
  neither run produced;
- a float64 rerun from the call's own recorded inputs differs beyond rounding;
- an op that cannot be rerun received exactly the golden's inputs and put out more than
  rounding;
- at the first decode step, a module whose inputs, weights and insides (all in the shard)
  match the golden exactly put out more than reordered rounding.

Each is a rule of the walk, applied only where the walk would apply it with nothing but the
shard at hand: error carried in from another shard (a drifting input, what a collective
gathered from other ranks, statistics inheriting their producer's drift) never convicts. So a
run that differs from its golden only by rounding noise (a bf16 port against fp32) fails no
shard, and a bug fails the shards that hold it, not every shard downstream of it.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence

from ..dump._records import Call, Record
from ._guilt import failing_records, hides_collectives, source_reason, within
from ._outputs import OutputJudge, divergence
from ._provenance import ContentKey, Provenance, fingerprint_of
from ._results import Divergence, RecordComparison, StatsComparison, is_input, layer_of
from ._stomps import Stomps


class OwnGuilt:
    """What judging calls on their own records needs from the whole dumps' index, made once
    per process. ``target_calls``: every call of the target, matched or not;
    ``golden_only``: the golden's calls the target does not make."""

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
        #: built on first use: a clean shard never needs them
        self._producers: dict[ContentKey, set[tuple[int, str]]] | None = None
        self._golden_only_producers: dict[ContentKey, set[tuple[int, str]]] = {}
        self._layers: dict[tuple[int, int], set[str]] | None = None

    def in_shard(self) -> ShardJudge:
        """A judge of one shard's calls, given in walk order."""
        return ShardJudge(self)

    def from_nowhere(
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

    @functools.cached_property
    def stomps(self) -> Stomps:
        """The stomps capture recorded in the target (see :class:`Stomps`)."""
        return Stomps(self.provenance, self._target_calls)

    @functools.cached_property
    def hidden_collectives(self) -> bool:
        """A module's output may hold other ranks' error (see :func:`hides_collectives`)."""
        return hides_collectives(self._target_calls)

    def holds_other_shards(self, module: Call) -> bool:
        """The module holds a decoder layer (other than its own) that its rank ran at its
        step: calls inside it lie in other shards."""
        if self._layers is None:
            self._layers = {}
            for c in self._target_calls:
                if (layer := layer_of(c.module)) is not None:
                    self._layers.setdefault((c.step, c.rank), set()).add(layer)
        path, own = module.module or "", layer_of(module.module)
        layers = self._layers.get((module.step, module.rank), set())
        return any(layer != own and within(layer, path) for layer in layers)


class ShardJudge:
    """Judges the calls of one shard, in walk order, on their own records and, for a module,
    on the calls inside it that came before it in the shard."""

    def __init__(self, own: OwnGuilt) -> None:
        self.own = own
        self.outputs = own.outputs
        #: (module path, level) of the calls judged so far: their weights' error level and,
        #: where their inputs matched exactly, their outputs' (the rounding born inside them)
        self._levels: list[tuple[str, float]] = []
        #: the modules of the calls convicted so far: a module around one repeats its guilt
        self._convicted: list[str] = []

    def verdict(
        self, golden: Call, target: Call, compared: list[RecordComparison]
    ) -> Divergence | None:
        """The call's guilt in the walk's order (its weights, its inputs, its outputs), where
        the shard proves it; None where proving it needs other shards."""
        found = self._verdict(golden, target, compared)
        self._remember(target, compared)
        if found is not None:
            self._convicted.append(target.module or "")
        return found

    def _verdict(
        self, golden: Call, target: Call, compared: list[RecordComparison]
    ) -> Divergence | None:
        for r, record, _ in failing_records(golden, target, compared):
            stomp = self.own.stomps.captured(golden, target, r, record)
            if stomp is not None:
                return stomp
        for r in compared:
            if r.slot.startswith("parameters") and r.failed:
                return divergence(
                    target, golden, "source", source_reason(self.own.provenance, r, None), r
                )
        inputs = [r for r in compared if is_input(r.slot)]
        found = self._source(golden, target, inputs)
        if found is not None:
            return found
        failing = [r for r in compared if r.failed and r.slot.startswith("output")]
        if not failing:
            return None
        if target.kind == "Module":
            return self._module(golden, target, compared, inputs, failing)
        if self.outputs.measurements.refusal(target) is None:
            return self.outputs.judge_rerun(golden, target, failing)[0]
        if not target.collective and all(_exact(r) for r in inputs):
            return self.outputs.judge_clean_inputs(golden, target, failing)
        return None

    def _module(
        self,
        golden: Call,
        target: Call,
        compared: list[RecordComparison],
        inputs: list[RecordComparison],
        failing: list[RecordComparison],
    ) -> Divergence | None:
        """The walk's rule for a module with clean inputs, where the shard holds what it
        needs: the first decode step (the walk also counts weights and rounding inside the
        module at earlier steps), a module holding no layer (its insides would lie in other
        shards), tensor data (matching statistics may inherit drift), no other rank's error
        hidden in it (a collective the dump does not record)."""
        if (
            target.step != self.own.first_step
            or not all(_exact(r) for r in inputs)
            or self.own.hidden_collectives
            or self.own.holds_other_shards(target)
        ):
            return None
        path = target.module or ""
        if any(within(m, path) for m in self._convicted):
            return None  # a call inside it is guilty already
        inside = max((level for m, level in self._levels if within(m, path)), default=0.0)
        if max(_weights(compared), inside) > 0.0:
            return None
        return self.outputs.judge_clean_inputs(golden, target, failing)

    def _remember(self, target: Call, compared: list[RecordComparison]) -> None:
        """What the walk would count inside the modules around ``target``: its weights' error,
        and its outputs' where its inputs matched. Matching statistics count as matching here,
        unlike in :func:`_exact`: this must count at least what the walk counts, never less."""
        level = _weights(compared)
        if all(r.error_level == 0.0 for r in compared if is_input(r.slot)):
            outputs = [r.error_level for r in compared if r.slot.startswith("output")]
            level = max([level, *outputs])
        if level != 0.0:
            self._levels.append((target.module or "", level))

    def _source(
        self, golden: Call, target: Call, inputs: list[RecordComparison]
    ) -> Divergence | None:
        """A failing input that no call produced, at the first decode step: an argument, or,
        where ops are recorded, a weight, constant or model input (in a module-level dump glue
        code between modules is not recorded, so a tensor may come from it). A buffer filled
        piece by piece (``memory`` ``filled``) was produced by the recorded writes into its
        slices, as the walk counts it. At a later step what the model received may follow
        another token that noise made the generation pick (after which the walk judges
        nothing), which only earlier shards tell."""
        if target.step != self.own.first_step:
            return None
        for r, record, golden_record in failing_records(golden, target, inputs):
            if record.memory == "filled":
                continue
            if not record.is_tensor or (
                self.own.provenance.op_level
                and self.own.from_nowhere(golden, target, record, golden_record)
            ):
                reason = source_reason(self.own.provenance, r, record)
                return divergence(target, golden, "source", reason, r)
        return None


def _exact(r: RecordComparison) -> bool:
    """An input equal to the golden's; statistics that match may still inherit their
    producer's drift (four statistics miss a permutation), which another shard tells."""
    return r.error_level == 0.0 and not isinstance(r.metrics, StatsComparison)


def _weights(compared: list[RecordComparison]) -> float:
    """The error level of a call's own weights (its ``parameters`` records)."""
    return max((r.error_level for r in compared if r.slot.startswith("parameters")), default=0.0)


def _producers(calls: Iterable[Call]) -> dict[ContentKey, set[tuple[int, str]]]:
    """The calls, as (step, name), that put out each content, by (rank, content) where the
    content is known."""
    out: dict[ContentKey, set[tuple[int, str]]] = {}
    for call in calls:
        for r in call.outputs:
            if (fingerprint := fingerprint_of(r)) is not None:
                out.setdefault((call.rank, fingerprint), set()).add((call.step, call.name))
    return out
