"""Dump against dump: compare every record of aligned calls, find where the error started.

The calls are aligned in :mod:`._alignment`. The target is then walked in the order calls
finished (an op before the module around it, a layer's modules before the layer, step after
step), every record judged against its golden, and every call judged for guilt, not for
difference: its inputs match but its output does not; an input from nowhere differs (a weight, a
constant); an input comes from another call or from code only one run has; or a float64 rerun
from its own recorded inputs shows that it computes wrong. A call whose output differs only
because its inputs did is innocent: that is accumulated rounding (noise), as in a bf16 run
compared with an fp32 one. The rules and their causes: ``docs/compare.md``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from ..dump._records import Call, Dump, Record
from ..numerics._dtypes import dtype_from_name
from ._alignment import completion_order
from ._foreign import received_exactly
from ._outputs import OutputJudge, divergence
from ._provenance import Provenance, home, join
from ._records import RecordComparer
from ._results import (
    Cause,
    DerivedInput,
    Divergence,
    RecordComparison,
    evidence,
    is_input,
    layer_of,
)
from ._stomps import Stomps
from ._weight_cast import judge_weight_casts


class GuiltJudge:
    """Walks the aligned calls in completion order and decides guilt, tracing a drifting
    input to where it came from. The first strong culprit ends the search; a weak one
    (amplification) is reported only if no strong one follows."""

    def __init__(
        self,
        records: RecordComparer,
        provenance: Provenance,
        target_calls: Sequence[Call],
        golden: Dump,
    ) -> None:
        #: compares what leaves a suspected module, and knows the steps that failed
        self.records = records
        self.provenance = provenance
        self.outputs = OutputJudge(records.precision, provenance, records.measurements)
        self.stomps = Stomps(provenance, target_calls)
        #: steps in which some record failed (a later step's new token ids are then no source)
        self.failing_steps: set[int] = set()
        self.first_step = min((c.step for c in target_calls), default=0)
        #: a module with clean inputs may hold other ranks' error: only a weak culprit then
        self.hidden_collectives = hides_collectives(target_calls)
        #: inputs that came out of code only one run has, by (rank, step, module path): judged
        #: by what leaves that module
        self.pending: dict[tuple[int, int, str], _Suspicion] = {}
        self.strong: Divergence | None = None
        self.weak: Divergence | None = None
        self.inputs_diverged: Divergence | None = None
        #: failing inputs with no recorded producer, matched to a recorded output
        self.derived: list[DerivedInput] = []
        #: the last target call inside each module (and its ancestors), by (rank, step, path)
        self.last_in: dict[tuple[int, int, str], Call] = {}
        #: per (rank, step), in walk order: calls only one run makes, then the judged ops
        #: whose output failed, as (name, module); a guilty module names one inside it
        self.foreign: dict[tuple[int, int], list[tuple[str, str | None]]] = {}
        #: calls only the target makes that read exactly what the golden's calls put out
        self.clean_foreign: set[str] = set()
        self.failing_ops: dict[tuple[int, int], list[tuple[str, str | None]]] = {}
        #: the golden's calls by (step, rank), each in completion order
        by_step_rank: dict[tuple[int, int], list[Call]] = {}
        for call in golden.calls:
            by_step_rank.setdefault((call.step, call.rank), []).append(call)
        self.golden_calls = {key: completion_order(c) for key, c in by_step_rank.items()}

    @property
    def unverified(self) -> list[str]:
        """Calls whose failing outputs could not be checked (no rerun, no amplification)."""
        return self.outputs.unverified

    def first_divergence(self) -> Divergence | None:
        """The strong culprit, else the first weak one (amplification, or code only the target
        runs whose module output could not be judged)."""
        for key in list(self.pending):
            self._settle(key, None)
        return self.strong or self.weak

    def judge_call(
        self,
        golden: Call,
        target: Call,
        compared: list[RecordComparison],
        received: float = 0.0,
    ) -> list[RecordComparison]:
        """Judge one aligned call (until a strong culprit is found), then remember what it
        produced. ``received``: for a collective, the error the ranks' inputs to it carry.
        Returns ``compared`` as judged: a weight that passed may be no cast of the golden's."""
        compared = judge_weight_casts(
            golden,
            target,
            compared,
            self.provenance,
            stats_in_float64=self.records.exact_weight_stats,
        )
        if any(r.failed for r in compared):
            self.failing_steps.add(target.step)
        for key in list(self.pending):
            rank, step, path = key
            # a step's ranks are walked in lockstep: another rank's call leaves nothing
            if step != target.step or (rank == target.rank and not within(target.module, path)):
                self._settle(key, None)  # the walk left the module: its last outputs decide
        if self.strong is None and self.inputs_diverged is None:
            self._found(self._verdict(golden, target, compared, received))
        self.track(target)
        if target.kind != "Module" and any(
            r.failed for r in compared if r.slot.startswith("output")
        ):
            self.failing_ops.setdefault((target.rank, target.step), []).append(
                (target.name, target.module)
            )
        self.provenance.remember(golden, target, compared)
        return compared

    def unmatched(self, side: Literal["golden", "target"], calls: Sequence[Call]) -> None:
        """Calls only one run makes: the target's are walked like the others."""
        for call in calls:
            self.foreign.setdefault((call.rank, call.step), []).append(
                (f"{call.name} (only the {side} makes it)", call.module)
            )
            if side == "target":
                self.track(call)
                if received_exactly(self.provenance, call, self.clean_foreign):
                    self.clean_foreign.add(call.name)

    def track(self, target: Call) -> None:
        """The last target call inside each module, matched or not: what leaves it."""
        path: str | None = target.module or ""  # a call with no module runs in the root
        while path is not None:
            self.last_in[(target.rank, target.step, path)] = target
            path = path.rpartition(".")[0] if path else None

    def _found(self, found: Divergence | None) -> None:
        if found is None:
            return
        hidden = self.hidden_collectives and found.rule == "module with clean inputs"
        if found.cause in _WEAK or hidden:
            self.weak = self.weak or found
        elif self.strong is None:
            self.strong = found

    def _settle(self, key: tuple[int, int, str], outputs: list[RecordComparison] | None) -> None:
        """Judge a suspicion of code only one run has by what left its module: the module's
        own outputs, or (without module records) the outputs of the last call inside it."""
        suspicion = self.pending.pop(key)
        leaving = self._last_outputs(key, self.last_in.get(key)) if outputs is None else outputs
        differing = [r for r in evidence(leaving) if self.outputs.code_difference(r)]
        if differing:
            worst = max(differing, key=lambda r: r.error_level)
            reason = (
                f"{suspicion.divergence.reason}; what leaves {key[2] or 'the model'} "
                f"({worst.name} {worst.slot}) differs by more than reordered rounding "
                f"(error level {worst.error_level:.3g})"
            )
            found = replace(suspicion.divergence, reason=reason)
            if suspicion.module is not None:  # where the foreign code runs, not its consumer
                found = replace(found, module=suspicion.module, layer=layer_of(suspicion.module))
            self._found(found)

    def _last_outputs(
        self, key: tuple[int, int, str], target: Call | None
    ) -> list[RecordComparison]:
        """Without module records, what leaves a module is its last call's output: each run's
        own last call there (rewritten code pairs its calls differently, or not at all)."""
        rank, step, path = key
        inside = [c for c in self.golden_calls.get((step, rank), []) if within(c.module, path)]
        if target is None or not inside:
            return []
        golden = inside[-1]
        golden_slots = {r.slot: r for r in golden.outputs}
        return [
            self.records.compare_record(golden, target, golden_slots[t.slot], t)
            for t in target.outputs
            if t.slot in golden_slots
        ]

    def _verdict(
        self, golden: Call, target: Call, compared: list[RecordComparison], received: float
    ) -> Divergence | None:
        for r, record, golden_record in failing_records(golden, target, compared):
            stomp = self.stomps.find(golden, target, r, record, golden_record)
            if stomp is not None:  # what the call read or put out was changed behind its back
                return stomp
        for r in compared:
            if r.slot.startswith("parameters"):
                if r.failed:
                    return divergence(
                        target, golden, "source", source_reason(self.provenance, r, None), r
                    )
                self.provenance.remember_parameter(target.rank, r)
        inputs = [r for r in compared if is_input(r.slot)]
        found = self._judge_inputs(golden, target, inputs)
        if found is not None or self.inputs_diverged is not None:
            return found
        outputs = [r for r in compared if r.slot.startswith("output")]
        failing = [r for r in outputs if r.failed]
        key = (target.rank, target.step, target.module or "")
        if target.kind == "Module" and key in self.pending:
            self._settle(key, outputs)
            if self.strong is not None:
                return None
        if not failing:
            self.provenance.note_noise(target, inputs, compared)
            return None
        if target.kind == "Module" and self.provenance.op_level:
            return self._judge_module(golden, target, inputs, failing, outputs)
        return self.outputs.judge(golden, target, inputs, failing, received)

    def _judge_module(
        self,
        golden: Call,
        target: Call,
        inputs: list[RecordComparison],
        failing: list[RecordComparison],
        outputs: list[RecordComparison],
    ) -> Divergence | None:
        """The ops inside were judged one by one and none was guilty; but if the module
        received exactly the golden's inputs and weights and what leaves it differs beyond
        reordered rounding, the error was made inside it: code only one run has, or ops whose
        own errors each passed for rounding. The walk is in completion order, so the first
        module that qualifies is the innermost."""
        if self.provenance.received_level(target, inputs) > 0.0:
            return None
        alike = any(not r.incomparable for r in outputs)
        dirty = [
            r for r in evidence(failing, alike_elsewhere=alike) if self.outputs.code_difference(r)
        ]
        if not dirty:
            return None
        worst = max(dirty, key=lambda r: r.error_level)
        key = (target.rank, target.step)
        sites = [(n, m) for n, m in self.foreign.get(key, []) if within(m, target.module or "")]
        foreign = [n for n, _ in sites]
        ops = [n for n, m in self.failing_ops.get(key, []) if within(m, target.module or "")]
        if foreign:
            inside = f"code only one run has inside it, first {foreign[0]}"
        else:
            inside = f"first failing op inside it: {ops[0]}" if ops else "no op inside recorded"
        reason = (
            f"its inputs and weights match the golden exactly, {worst.slot} differs beyond "
            f"reordered rounding ({worst.reason}); {inside}"
        )
        cause: Cause = "unmatched" if foreign else "output"
        found = divergence(target, golden, cause, reason, worst, "module with clean inputs")
        # where the code only one run has runs (an error below reordered rounding at its own
        # module may cross it only further out): the innermost module holding all of it
        place = _common_module([m for _, m in sites])
        if place is not None and place != (target.module or ""):
            found = replace(found, module=place, layer=layer_of(place))
        return found

    def _judge_inputs(
        self, golden: Call, target: Call, inputs: list[RecordComparison]
    ) -> Divergence | None:
        """An input that differs: from nowhere (a source), from code only the target runs
        (judged at its module's output), or from another call than in the golden (wiring)."""
        for r, record, golden_record in failing_records(golden, target, inputs):
            producers = self.provenance.producers(target.rank, record)
            expected = self.provenance.golden_producers(golden.rank, golden_record)
            stranger = (
                self.provenance.unmatched_producer(target.rank, record) if not producers else None
            )
            lost = self.provenance.lost_producers(expected)
            if stranger is not None or lost:
                if self.outputs.beyond_rounding(golden, target, r):
                    self._suspect_code(golden, target, r, stranger, lost[0] if lost else None)
                continue
            if not producers and self._derived(target, r, record):
                continue
            if not producers and self._is_source(record):
                if self._is_new_prompt(target, record):
                    reason = (
                        f"from step {target.step} on the model's inputs differ ({r.slot} of "
                        f"{target.name}): earlier steps differed only by noise, and generation "
                        "took another token"
                    )
                    self.inputs_diverged = divergence(target, golden, "source", reason, r)
                    return None
                return divergence(
                    target, golden, "source", source_reason(self.provenance, r, record), r
                )
            if (
                producers
                and expected
                and not {(p.golden_name, p.slot) for p in producers} & expected
                and self.outputs.beyond_rounding(golden, target, r)
            ):
                reason = self._wiring_reason(r, producers, expected)
                return divergence(target, golden, "wiring", reason, r)
        return None

    def _wiring_reason(
        self,
        r: RecordComparison,
        producers: list[RecordComparison],
        expected: set[tuple[str, str]],
    ) -> str:
        producer, (name, slot) = producers[-1], min(expected)
        return (
            f"{r.slot} is {producer.name}'s {producer.slot}, but in the golden it is "
            f"{name}'s {slot}: the call received a different tensor"
        )

    def _suspect_code(
        self,
        golden: Call,
        target: Call,
        r: RecordComparison,
        stranger: tuple[str, str | None] | None,
        lost: tuple[str, str] | None,
    ) -> None:
        """An input beyond rounding that comes out of code the two runs do not share: a bug,
        or an equivalent rewrite (a fused kernel) whose rounding the next calls amplified.
        The module around it decides: its output differs beyond rounding, or it does not."""
        if stranger is not None:
            where = f"comes from {stranger[0]}, a call the golden does not make"
            runs_in: str | None = stranger[1]
        else:
            assert lost is not None
            runs_in = self.provenance.golden_only.get(lost[0])
            inside = f" (in {runs_in})" if runs_in else ""
            where = (
                f"is, in the golden, {lost[0]}'s {lost[1]}{inside}, a call the target does not make"
            )
        reason = f"{r.slot} {where}, and differs beyond rounding from the golden's ({r.reason})"
        found = divergence(target, golden, "unmatched", reason, r)
        if stranger is not None and runs_in is None and stranger[0] in self.clean_foreign:
            # no module around the foreign code: it read the golden's values exactly, and
            # this input is what leaves it
            if self.outputs.code_difference(r):
                leaves = "what leaves it differs by more than reordered rounding"
                clean = f"{stranger[0]} read exactly the golden's values, {leaves}"
                self._found(replace(found, reason=f"{reason}; {clean}"))
            return
        # filed under the module the foreign code runs in, so that it settles at the
        # innermost module holding it; one the target never enters: the consumer's
        key = (target.rank, target.step, runs_in or "")
        module = runs_in if runs_in and runs_in != target.module else None
        if key not in self.last_in:
            key, module = (target.rank, target.step, home(target) or ""), None
        self.pending.setdefault(key, _Suspicion(found, module))

    def _derived(self, target: Call, r: RecordComparison, record: Record) -> bool:
        """An input with no recorded producer that an unrecorded view, cast or slice made out
        of a recorded output, drifting no more than that output: its error is inherited."""
        if not (record.is_tensor and self.provenance.op_level):
            return False
        if self.provenance.parameter_name(target.rank, record) is not None:
            return False  # a module's own weight: compared as such
        found = self.provenance.recorded.derivation(record, r.error_level)
        if found is not None:
            self.derived.append(
                DerivedInput(target.name, r.slot, target.rank, target.step, found.describe())
            )
        return found is not None

    def _is_source(self, record: Record) -> bool:
        """An input that no recorded call produced. In a module-level dump, glue code between
        modules (a residual add) is not recorded, so only non-tensor values count there. A
        buffer filled piece by piece (``memory`` ``filled``) was produced by the recorded
        writes into its slices, which were judged."""
        if record.memory == "filled":
            return False
        return not record.is_tensor or self.provenance.op_level

    def _is_new_prompt(self, target: Call, record: Record) -> bool:
        """Token ids from nowhere at a later step, after steps that differed: the generation
        loop (outside the captured forward) picked another token."""
        return (
            record.is_tensor
            and not dtype_from_name(record.dtype).is_floating_point
            and target.step > self.first_step
            and any(step < target.step for step in self.failing_steps)
        )


def hides_collectives(calls: Sequence[Call]) -> bool:
    """Several ranks and no collective recorded (a module-level dump of a tensor-parallel
    run): a module's output may hold what an all_reduce inside it gathered from the other
    ranks, so its clean inputs do not prove the error was made there."""
    return len({c.rank for c in calls}) > 1 and not any(c.collective for c in calls)


def failing_records(
    golden: Call, target: Call, compared: list[RecordComparison]
) -> Iterator[tuple[RecordComparison, Record, Record | None]]:
    """The records that fail, each with its target record and the golden's (if recorded). An
    argument only the golden passes (``approximate="tanh"`` the target leaves out) stands for
    itself: the target ran with the default instead."""
    failed = [r for r in compared if r.failed]
    if not failed:  # most calls: no slot index to build
        return
    records = {r.slot: r for r in target.records}
    golden_records = {r.slot: r for r in golden.records}
    for r in failed:
        record = records.get(r.slot)
        if record is None and (only_golden := golden_records.get(r.slot)) is not None:
            record = None if only_golden.is_tensor else only_golden
        if record is not None:
            yield r, record, golden_records.get(r.slot)


def source_reason(provenance: Provenance, r: RecordComparison, record: Record | None) -> str:
    """Why an input that no recorded call produced (``record``; None: a module's own
    parameter) is a source of the divergence, naming the weight it is where known."""
    if record is None:
        what = f"parameter {join(r.module, r.slot.removeprefix('parameters.'))}"
    elif not record.is_tensor:
        what = f"argument {r.slot}"
    else:
        owner = provenance.parameter_name(record.rank, record)
        what = f"{r.slot} (parameter {owner})" if owner else f"input {r.slot}"
    derivable = (
        ", and it is no view, cast or slice of a recorded output drifting as much"
        if record is not None and record.is_tensor and provenance.op_level
        else ""
    )
    return (
        f"{what} differs from the golden and no recorded call produced it "
        f"(a weight, buffer, constant or model input, or the output of a call the capture "
        f"left out){derivable}: {r.reason}"
    )


@dataclass
class _Suspicion:
    """An input out of code only one run has, waiting for what leaves its module."""

    divergence: Divergence
    #: the module the foreign code runs in, when its consumer is elsewhere
    module: str | None = None


def _common_module(modules: list[str | None]) -> str | None:
    """The innermost module path that holds every one of ``modules`` (None for none)."""
    if not modules:
        return None
    parts = [m.split(".") if m else [] for m in modules]
    common: list[str] = []
    for names in zip(*parts, strict=False):
        if len(set(names)) != 1:
            break
        common.append(names[0])
    return ".".join(common)


def within(module: str | None, path: str) -> bool:
    """A call in ``module`` runs inside ``path``; a call with no module is in the root."""
    if not path:
        return True
    return module is not None and (module == path or module.startswith(path + "."))


#: Causes that are reported only when no other call is guilty.
_WEAK = frozenset({"amplification"})
