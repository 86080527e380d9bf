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

import math
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace

import torch

from .._errors import PrecisionInputError
from ..dump._records import Call, Dump, Record
from ..numerics._comparison import TensorComparison, judge_pair, judge_rounding, resolve_standard
from ..numerics._dtypes import dtype_from_name, dtype_name, lower_precision
from ..numerics._standards import Standard, StandardName
from ..numerics._stats import TensorStats
from ..rerun._ops import NotReplayable
from ..rerun._recompute import Rerun
from ._alignment import completion_order
from ._results import Cause, Divergence, RecordComparison, StatsComparison, Status, layer_of

#: A drifting call that cannot be rerun is suspected only when its output's error level exceeds
#: this many times its inputs'. Rounding noise amplifies less: bf16 and fp16 runs of the tiny
#: Llama against fp32 (2 and 4 layers, 8 and 32 tokens, tensor and statistics dumps) reached 12x.
AMPLIFICATION = 100.0


#: How far (relative RMS error) what leaves a module may differ when the same computation is
#: written another way (a fused kernel, another op order). Measured on the tiny Llama: bf16
#: rewrites 0.003 - 0.009, fp32 rewrites below 1e-6; a RoPE bug 0.3, a lost residual more.
REORDERED_ROUNDING = {
    torch.bfloat16: 0.05,
    torch.float16: 0.01,
    torch.float32: 1e-4,
    torch.float64: 1e-9,
}


@dataclass(frozen=True)
class RunPrecision:
    """How the target's floating dtypes relate to the golden's, learned from the weights (or,
    without module records, from all tensors): ``float32 -> bfloat16`` for a bf16 port of an
    fp32 reference, ``float32 -> float32`` for the same dtype on two devices."""

    golden: torch.dtype | None = None
    target: torch.dtype | None = None

    @classmethod
    def learn(cls, pairs: Iterable[tuple[Call, Call]]) -> RunPrecision:
        weights: Counter[tuple[torch.dtype, torch.dtype]] = Counter()
        tensors: Counter[tuple[torch.dtype, torch.dtype]] = Counter()
        for golden, target in pairs:
            golden_slots = {r.slot: r for r in golden.records}
            for t in target.records:
                g = golden_slots.get(t.slot)
                if g is None or not (g.is_tensor and t.is_tensor):
                    continue
                pair = dtype_from_name(g.dtype), dtype_from_name(t.dtype)
                if pair[0].is_floating_point and pair[1].is_floating_point:
                    (weights if t.slot.startswith("parameters") else tensors)[pair] += 1
        counts = weights or tensors
        if not counts:
            return cls()
        (golden_dtype, target_dtype), _ = counts.most_common(1)[0]
        return cls(golden_dtype, target_dtype)

    @property
    def crosses(self) -> bool:
        """The target runs in another precision than the golden."""
        return self.golden != self.target

    def judging_dtype(self, golden: torch.dtype, target: torch.dtype) -> torch.dtype:
        """The dtype whose standard judges a pair: the lower precision of the two, and never
        more than the run's (bf16 data that a bf16 run upcast to fp32 is still bf16 data)."""
        dtype = lower_precision(golden, target)
        if self.crosses and self.golden and self.target and dtype.is_floating_point:
            dtype = lower_precision(dtype, lower_precision(self.golden, self.target))
        return dtype

    def expects(self, golden: torch.dtype, target: torch.dtype) -> bool:
        """A floating dtype pair the run explains: equal, or the run's own change."""
        return golden == target or (golden, target) == (self.golden, self.target)


class _Judge:
    """Compares the records of aligned calls and decides guilt, remembering what earlier calls
    produced (by content) so that a drifting input can be told from a drifting source. One
    judge walks the whole comparison: a KV cache made at one step is read at the next."""

    def __init__(
        self,
        standard: Standard | StandardName | None,
        precision: RunPrecision,
        target_calls: Sequence[Call],
        golden: Dump,
        *,
        exact_weight_stats: bool,
    ) -> None:
        self.standard = standard
        self.precision = precision
        self.op_level = any(c.kind != "Module" for c in target_calls)
        self.first_step = min((c.step for c in target_calls), default=0)
        # Outputs of the calls judged so far, by (rank, content): the target's with how they
        # compared, the golden's by (call name, slot). Several calls may produce the same
        # content (``x.to(x.dtype)`` returns ``x``).
        self.produced: dict[_Key, list[RecordComparison]] = {}
        self.golden_produced: dict[_Key, set[tuple[str, str]]] = {}
        #: calls only the golden makes: name -> module path
        self.golden_only: dict[str, str | None] = {}
        self.unmatched_outputs: dict[_Key, str] = {}
        #: the module parameters of the target by content, to name the weight an op received
        self.parameters = {
            (c.rank, fingerprint): _join(c.module, r.slot.removeprefix("parameters."))
            for c in target_calls
            for r in c.parameters
            if (fingerprint := _fingerprint(r)) is not None
        }
        #: (rank, module path) -> the largest error level of parameters inside it
        self.parameter_levels: dict[tuple[int, str], float] = {}
        #: (rank, module path) -> the largest error level that calls inside it produced from
        #: inputs matching exactly and were cleared: rounding born there (another kernel)
        self.noise_origins: dict[tuple[int, str], float] = {}
        #: inputs that came out of code only one run has, by (rank, step, module path): judged
        #: by what leaves that module
        self.pending: dict[tuple[int, int, str], _Suspicion] = {}
        self.strong: Divergence | None = None
        self.weak: Divergence | None = None
        self.unverified: list[str] = []
        self.inputs_diverged: Divergence | None = None
        self.failing_steps: set[int] = set()
        #: the golden's calls by (step, rank), each in completion order
        by_step_rank: dict[tuple[int, int], list[Call]] = {}
        for call in golden.calls:
            by_step_rank.setdefault((call.step, call.rank), []).append(call)
        self.golden_calls = {key: completion_order(c) for key, c in by_step_rank.items()}
        #: weights' statistics must agree to 1e-12 (both dumps computed them in float64)
        self.exact_weight_stats = exact_weight_stats
        #: comparisons of stored tensor pairs, by (golden data id, target data id, dtype, exact)
        self.judged: dict[tuple[str, str, torch.dtype, bool], TensorComparison] = {}

    def first_divergence(self) -> Divergence | None:
        """The strong culprit, else the first weak one (amplification, or code only the target
        runs whose module output could not be judged)."""
        for key in list(self.pending):
            self._settle(key, None)
        return self.strong or self.weak

    # -- records ---------------------------------------------------------------------------------

    def compare_call(self, golden: Call, target: Call) -> list[RecordComparison]:
        """Every slot of the pair."""
        golden_slots = {r.slot: r for r in golden.records}
        out = []
        for t in target.records:
            g = golden_slots.pop(t.slot, None)
            out.append(self._compare_record(golden, target, g, t))
        for g in golden_slots.values():
            out.append(_row(golden, target, g.slot, "fail", "only the golden has this slot", g))
        outputs = [r for r in out if r.slot.startswith("output")]
        if outputs and not any(r.failed for r in outputs):
            identical = all(r.error_level == 0.0 for r in outputs)
            out = [_equivalent_spelling(r, identical) for r in out]
        if any(r.failed for r in out):
            self.failing_steps.add(target.step)
        return out

    def _compare_record(
        self, golden: Call, target: Call, g: Record | None, t: Record
    ) -> RecordComparison:
        if g is None:
            return _row(golden, target, t.slot, "fail", "only the target has this slot", t=t)
        if not (g.is_tensor and t.is_tensor):
            if g.is_tensor or t.is_tensor:
                return _row(golden, target, t.slot, "fail", "a tensor on one side only", g, t)
            return self._compare_values(golden, target, g, t)
        if g.shape != t.shape:
            return _row(golden, target, t.slot, "fail", f"shape {t.shape} vs {g.shape}", g, t)
        g_dtype, t_dtype = dtype_from_name(g.dtype), dtype_from_name(t.dtype)
        dtype = self.precision.judging_dtype(g_dtype, t_dtype)
        weight = t.slot.startswith("parameters") or (t.rank, _fingerprint(t)) in self.parameters
        if g.loader is not None and t.loader is not None:
            try:
                metrics = self._judge_records(g, t, dtype, weight)
            except PrecisionInputError as exc:
                return _row(golden, target, t.slot, "fail", str(exc), g, t)
            row = _row(golden, target, t.slot, metrics.verdict, metrics.reason, g, t, metrics)
        elif g.stats is not None and t.stats is not None:
            row = self._compare_stats(golden, target, g, t, g.stats, t.stats, dtype, weight)
        else:
            return _row(golden, target, t.slot, "skip", "no data or statistics to compare", g, t)
        if g_dtype.is_floating_point and not self.precision.expects(g_dtype, t_dtype):
            reason = (
                f"dtype {dtype_name(t_dtype)} where the golden has {dtype_name(g_dtype)} (the "
                f"run maps {dtype_name(self.precision.golden)} to "
                f"{dtype_name(self.precision.target)}); {row.reason}"
            )
            return replace(row, status="fail", reason=reason)
        return row

    def _compare_values(self, golden: Call, target: Call, g: Record, t: Record) -> RecordComparison:
        """Non-tensor arguments must be equal. Two exceptions only warn: a device (the runs are
        on two machines) and a floating dtype the run's own precision change explains."""
        if _same_value(g.value, t.value):
            return _row(golden, target, t.slot, "pass", "same value", g, t)
        reason = f"{t.value!r} vs {g.value!r}"
        if _is_device(g.value) and _is_device(t.value):
            return _row(golden, target, t.slot, "warn", f"device {reason}", g, t)
        g_dtype, t_dtype = _float_dtype(g.value), _float_dtype(t.value)
        if g_dtype and t_dtype and self.precision.expects(g_dtype, t_dtype):
            return _row(golden, target, t.slot, "warn", f"dtype {reason}", g, t)
        return _row(golden, target, t.slot, "fail", reason, g, t)

    def _judge_records(
        self, g: Record, t: Record, dtype: torch.dtype, weight: bool
    ) -> TensorComparison:
        """Compare the stored tensors, once per pair of stored data: a weight is recorded as a
        module's parameter and as the input of its op, an activation as a module's output and
        as the next call's input. Weights are data, not computations: any element that differs
        from the golden's (cast to the target's dtype) fails them."""
        key = None
        if g.data_id is not None and t.data_id is not None:
            key = (g.data_id, t.data_id, dtype, weight)
        known = self.judged.get(key) if key is not None else None
        if known is None:
            assert g.loader is not None
            assert t.loader is not None
            target_tensor, golden_tensor = t.loader(), g.loader()
            known = self._judge(target_tensor, golden_tensor, dtype)
            if weight and known.verdict != "fail":
                differing = _differing_elements(target_tensor, golden_tensor)
                if differing:
                    reason = (
                        f"{differing} of {target_tensor.numel()} weight element(s) differ from "
                        f"the golden's cast to {dtype_name(target_tensor.dtype)}; {known.reason}"
                    )
                    known = replace(known, verdict="fail", reason=reason)
            if key is not None:
                self.judged[key] = known
        return known

    def _judge(
        self, actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype
    ) -> TensorComparison:
        standard = resolve_standard(self.standard, dtype)
        return judge_pair(actual, expected, standard, dtype)

    def _compare_stats(
        self,
        golden: Call,
        target: Call,
        g: Record,
        t: Record,
        golden_stats: TensorStats,
        target_stats: TensorStats,
        dtype: torch.dtype,
        weight: bool,
    ) -> RecordComparison:
        """Statistics within the standard's relative tolerance: a tensor within it elementwise
        has statistics within it too. Weights of a run that keeps its dtypes must have the
        same statistics (to 1e-12, for sums taken in another order)."""
        stats = _stats_difference(golden_stats, target_stats)
        rtol, _ = resolve_standard(self.standard, dtype).tolerances(dtype)
        if dtype.is_floating_point:
            rtol = max(rtol, torch.finfo(dtype).eps)
        exact = weight and not self.precision.crosses
        if exact and g.checksum is not None and t.checksum is not None and g.checksum != t.checksum:
            reason = f"weight content checksum {t.checksum} vs {g.checksum}"
            return _row(
                golden,
                target,
                t.slot,
                "fail",
                reason,
                g,
                t,
                _stats_difference(golden_stats, target_stats),
            )
        if exact and self.exact_weight_stats:
            rtol = _SAME_SUM
        if stats.non_finite_differs:
            reason = (
                f"NaN/Inf counts differ: {_non_finite(target_stats)} vs {_non_finite(golden_stats)}"
            )
            return _row(golden, target, t.slot, "fail", reason, g, t, stats)
        worst = max(("max", "min", "mean", "norm"), key=lambda k: getattr(stats, f"{k}_diff"))
        level = getattr(stats, f"{worst}_diff")
        verdict: Status = "pass" if level <= rtol else "fail"
        what = "weight statistics" if exact and self.exact_weight_stats else "statistics"
        reason = f"{what} differ by up to {level:.3g} ({worst}; tolerance {rtol:.3g})"
        return _row(golden, target, t.slot, verdict, reason, g, t, stats)

    # -- remembering -----------------------------------------------------------------------------

    def remember_golden_only(self, calls: Iterable[Call]) -> None:
        """Calls only the golden makes: a target input whose golden counterpart came from one
        of them was wired differently (an op or residual the target lost)."""
        for call in calls:
            self.golden_only[call.name] = call.module
            self._remember_golden(call)

    def remember_unmatched(self, target: Call) -> None:
        """A call only the target makes: what it produces has no golden counterpart."""
        for record in target.outputs:
            fingerprint = _fingerprint(record)
            if fingerprint is not None:
                self.unmatched_outputs.setdefault((target.rank, fingerprint), target.name)

    def _remember(self, golden: Call, target: Call, compared: list[RecordComparison]) -> None:
        if target.kind == "Module" and self.op_level:
            return  # a module's output is its last op's: the op is the producer
        by_slot = {r.slot: r for r in compared}
        for record in target.outputs:
            fingerprint = _fingerprint(record)
            if fingerprint is not None and record.slot in by_slot:
                key = (target.rank, fingerprint)
                self.produced.setdefault(key, []).append(by_slot[record.slot])
        self._remember_golden(golden)

    def _remember_golden(self, golden: Call) -> None:
        if golden.kind == "Module" and self.op_level:
            return
        for record in golden.outputs:
            fingerprint = _fingerprint(record)
            if fingerprint is not None:
                key = (golden.rank, fingerprint)
                self.golden_produced.setdefault(key, set()).add((golden.name, record.slot))

    # -- guilt -----------------------------------------------------------------------------------

    def judge_call(self, golden: Call, target: Call, compared: list[RecordComparison]) -> None:
        """Judge one aligned call (until a strong culprit is found), then remember what it
        produced."""
        for key in list(self.pending):
            if key[:2] != (target.rank, target.step) or not _within(target.module, key[2]):
                self._settle(key, None)  # the walk left the module: its last outputs decide
        if self.strong is None and self.inputs_diverged is None:
            self._found(self._verdict(golden, target, compared))
        self.track(target)
        self._remember(golden, target, compared)

    def track(self, target: Call) -> None:
        """The last target call inside each suspected module, matched or not."""
        for key, suspicion in self.pending.items():
            if key[:2] == (target.rank, target.step) and _within(target.module, key[2]):
                suspicion.last = target

    def _found(self, found: Divergence | None) -> None:
        if found is not None and found.cause in _WEAK:
            self.weak = self.weak or found
        elif found is not None and self.strong is None:
            self.strong = found

    def _settle(self, key: tuple[int, int, str], outputs: list[RecordComparison] | None) -> None:
        """Judge a suspicion of code only one run has by what left its module: the module's
        own outputs, or (without module records) the outputs of the last call inside it."""
        suspicion = self.pending.pop(key)
        leaving = self._last_outputs(key, suspicion.last) if outputs is None else outputs
        differing = [r for r in leaving if self._code_difference(r)]
        if differing:
            worst = max(differing, key=lambda r: r.error_level)
            reason = (
                f"{suspicion.divergence.reason}; what leaves {key[2] or 'the model'} "
                f"({worst.name} {worst.slot}) differs by more than reordered rounding "
                f"(error level {worst.error_level:.3g})"
            )
            self._found(replace(suspicion.divergence, reason=reason))

    def _last_outputs(
        self, key: tuple[int, int, str], target: Call | None
    ) -> list[RecordComparison]:
        """Without module records, what leaves a module is its last call's output: each run's
        own last call there (rewritten code pairs its calls differently, or not at all)."""
        rank, step, path = key
        inside = [c for c in self.golden_calls.get((step, rank), []) if _within(c.module, path)]
        if target is None or not inside:
            return []
        golden = inside[-1]
        golden_slots = {r.slot: r for r in golden.outputs}
        return [
            self._compare_record(golden, target, golden_slots[t.slot], t)
            for t in target.outputs
            if t.slot in golden_slots
        ]

    def _verdict(
        self, golden: Call, target: Call, compared: list[RecordComparison]
    ) -> Divergence | None:
        for r in compared:
            if r.slot.startswith("parameters"):
                if r.failed:
                    return _divergence(target, golden, "source", self._source_reason(r, None), r)
                key = (target.rank, r.module or "")
                self.parameter_levels[key] = max(self.parameter_levels.get(key, 0.0), r.error_level)
        inputs = [r for r in compared if _is_input(r.slot)]
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
            self._note_noise(target, inputs, compared)
            return None
        if target.kind == "Module" and self.op_level:
            return None  # the ops inside it were judged one by one
        return self._judge_output(golden, target, inputs, failing)

    def _judge_inputs(
        self, golden: Call, target: Call, inputs: list[RecordComparison]
    ) -> Divergence | None:
        """An input that differs: from nowhere (a source), from code only the target runs
        (judged at its module's output), or from another call than in the golden (wiring)."""
        records = {r.slot: r for r in target.records}
        golden_records = {r.slot: r for r in golden.records}
        for r in inputs:
            record = records.get(r.slot)
            if not r.failed or record is None:
                continue
            key = (target.rank, _fingerprint(record))
            producers = self.produced.get(key, [])
            expected = self.golden_produced.get(
                (golden.rank, _fingerprint(golden_records.get(r.slot)))
            )
            stranger = self.unmatched_outputs.get(key) if not producers else None
            lost = (
                sorted(expected)
                if expected and expected <= self._golden_only_slots(expected)
                else []
            )
            if stranger is not None or lost:
                if self._beyond_rounding(golden, target, r):
                    self._suspect_code(golden, target, r, stranger, lost[0] if lost else None)
                continue
            if not producers and self._is_source(record):
                if self._is_new_prompt(target, record):
                    reason = (
                        f"from step {target.step} on the model's inputs differ ({r.slot} of "
                        f"{target.name}): earlier steps differed only by noise, and generation "
                        "took another token"
                    )
                    self.inputs_diverged = _divergence(target, golden, "source", reason, r)
                    return None
                return _divergence(target, golden, "source", self._source_reason(r, record), r)
            if (
                producers
                and expected
                and not {(p.golden_name, p.slot) for p in producers} & expected
                and self._beyond_rounding(golden, target, r)
            ):
                reason = self._wiring_reason(r, producers, expected)
                return _divergence(target, golden, "wiring", reason, r)
        return None

    def _golden_only_slots(self, slots: set[tuple[str, str]]) -> set[tuple[str, str]]:
        return {(name, slot) for name, slot in slots if name in self.golden_only}

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
        stranger: str | None,
        lost: tuple[str, str] | None,
    ) -> None:
        """An input beyond rounding that comes out of code the two runs do not share: a bug,
        or an equivalent rewrite (a fused kernel) whose rounding the next calls amplified.
        The module around it decides: its output differs beyond rounding, or it does not."""
        if stranger is not None:
            where = f"comes from {stranger}, a call the golden does not make"
        else:
            assert lost is not None
            module = self.golden_only.get(lost[0])
            inside = f" (in {module})" if module else ""
            where = (
                f"is, in the golden, {lost[0]}'s {lost[1]}{inside}, a call the target does not make"
            )
        reason = f"{r.slot} {where}, and differs beyond rounding from the golden's ({r.reason})"
        module = target.module or ""
        if target.kind == "Module":
            module = module.rpartition(".")[0]
        self.pending.setdefault(
            (target.rank, target.step, module),
            _Suspicion(_divergence(target, golden, "unmatched", reason, r)),
        )

    def _is_source(self, record: Record) -> bool:
        """An input that no recorded call produced. In a module-level dump, glue code between
        modules (a residual add) is not recorded, so only non-tensor values count there."""
        return not record.is_tensor or self.op_level

    def _is_new_prompt(self, target: Call, record: Record) -> bool:
        """Token ids from nowhere at a later step, after steps that differed: the generation
        loop (outside the captured forward) picked another token."""
        return (
            record.is_tensor
            and not dtype_from_name(record.dtype).is_floating_point
            and target.step > self.first_step
            and any(step < target.step for step in self.failing_steps)
        )

    def _source_reason(self, r: RecordComparison, record: Record | None) -> str:
        if record is None:  # a module's own parameter
            what = f"parameter {_join(r.module, r.slot.removeprefix('parameters.'))}"
        elif not record.is_tensor:
            what = f"argument {r.slot}"
        else:
            owner = self.parameters.get((record.rank, _fingerprint(record)))
            what = f"{r.slot} (parameter {owner})" if owner else f"input {r.slot}"
        return (
            f"{what} differs from the golden and no recorded call produced it "
            f"(a weight, buffer, constant or model input, or the output of a call the capture "
            f"left out): {r.reason}"
        )

    def _input_level(self, target: Call, inputs: list[RecordComparison]) -> float:
        """How far a call's inputs are from the golden's: for a module, the weights inside it
        and the rounding its children introduced count too."""
        level = max((r.error_level for r in inputs), default=0.0)
        if target.kind == "Module":
            inside = _inside_paths(target.rank, target.module or "")
            for levels in (self.parameter_levels, self.noise_origins):
                level = max(level, max((v for k, v in levels.items() if inside(k)), default=0.0))
        return level

    def _note_noise(
        self, target: Call, inputs: list[RecordComparison], compared: list[RecordComparison]
    ) -> None:
        """A call with exactly matching inputs whose outputs differ anyway (within the
        standard, or cleared): another kernel's rounding, born here."""
        outputs = [r.error_level for r in compared if r.slot.startswith("output")]
        level = max(outputs, default=0.0)
        if level == 0.0 or not math.isfinite(level) or self._input_level(target, inputs) > 0.0:
            return
        path = target.module or ""
        while True:
            key = (target.rank, path)
            self.noise_origins[key] = max(self.noise_origins.get(key, 0.0), level)
            if not path:
                return
            path = path.rpartition(".")[0]

    def _slipped(self, r: RecordComparison) -> bool:
        """A floating dtype the run's precision does not explain (bf16 in an fp32 run)."""
        if r.golden_dtype is None or r.target_dtype is None:
            return False
        golden, target = dtype_from_name(r.golden_dtype), dtype_from_name(r.target_dtype)
        floating = golden.is_floating_point and target.is_floating_point
        return floating and not self.precision.expects(golden, target)

    def _code_difference(self, r: RecordComparison) -> bool:
        """A failing output that differs by more than reordered rounding: a relative RMS error
        above a tenth of the dtype's gross-error limit (bf16 0.05, fp16 0.01, fp32 0.001).
        Equivalent rewrites (a fused kernel, another op order) stay far below it."""
        if not r.failed:
            return False
        if not isinstance(r.metrics, (TensorComparison, StatsComparison)):
            return True
        golden = dtype_from_name(r.golden_dtype or r.target_dtype)
        target = dtype_from_name(r.target_dtype or r.golden_dtype)
        dtype = self.precision.judging_dtype(golden, target)
        level = (
            r.metrics.largest_difference
            if isinstance(r.metrics, StatsComparison)
            else r.error_level
        )
        return level > REORDERED_ROUNDING.get(dtype, REORDERED_ROUNDING[torch.float32])

    def _beyond_rounding(self, golden: Call, target: Call, r: RecordComparison) -> bool:
        """A failing record whose difference is more than rounding: outside the rounding
        envelope of the golden value (a statistics record has nothing finer than failing)."""
        if not r.failed:
            return False
        if not isinstance(r.metrics, TensorComparison) or self._slipped(r):
            return True
        g = next((x for x in golden.records if x.slot == r.slot), None)
        t = next((x for x in target.records if x.slot == r.slot), None)
        g_tensor = None if g is None else g.load()
        t_tensor = None if t is None else t.load()
        if g_tensor is None or t_tensor is None or not t_tensor.is_floating_point():
            return True
        return judge_rounding(t_tensor, g_tensor.double(), r.metrics.dtype).verdict == "fail"

    def _judge_output(
        self,
        golden: Call,
        target: Call,
        inputs: list[RecordComparison],
        failing: list[RecordComparison],
    ) -> Divergence | None:
        """An output fails: guilty if the call added error of its own. A rerun in float64 from
        the target's own recorded inputs tells; without one, exactly matching inputs convict
        an output beyond rounding, and drifting inputs convict (weakly) only if the call
        amplified their error."""
        worst = max(failing, key=lambda r: r.error_level)
        before = self._input_level(target, inputs)
        try:
            rerun = Rerun(target) if target.kind != "Module" else None
        except NotReplayable as exc:
            rerun, why_not = None, str(exc)
        else:
            why_not = "a module is not rerun"
        if rerun is not None:
            found, cleared = self._judge_rerun(golden, target, failing, rerun)
            if found is None and cleared and before == 0.0:
                self._note_noise(target, inputs, failing)
            elif found is None and not cleared:
                self.unverified.append(target.name)
            return found
        if before == 0.0:
            # a module holds many roundings: one rounding's envelope would convict a fused
            # kernel inside it, so a module must differ by more than reordered rounding
            beyond = [
                r
                for r in failing
                if (
                    self._code_difference(r)
                    if target.kind == "Module"
                    else self._beyond_rounding(golden, target, r)
                )
            ]
            if beyond:
                worst = max(beyond, key=lambda r: r.error_level)
                reason = (
                    f"its inputs match the golden exactly, {worst.slot} does not: {worst.reason}"
                )
                return _divergence(target, golden, "output", reason, worst)
            self._note_noise(target, inputs, failing)
            return None
        after = worst.error_level
        if after > AMPLIFICATION * before:
            reason = (
                f"its inputs differ slightly (error level {before:.3g}), {worst.slot} much more "
                f"({after:.3g}); it cannot be rerun to check ({why_not}): {worst.reason}"
            )
            return _divergence(target, golden, "amplification", reason, worst)
        self.unverified.append(target.name)
        return None

    def _judge_rerun(
        self,
        golden: Call,
        target: Call,
        failing: list[RecordComparison],
        rerun: Rerun,
    ) -> tuple[Divergence | None, bool]:
        """The culprit if a failing output lands outside its dtype's rounding envelope of the
        rerun; and whether every failing output could be checked at all. An overflow of the
        output's dtype convicts too: it is where the model leaves the dtype's range."""
        try:
            records = {r.slot: r for r in target.outputs}
            checked = True
            for r in failing:
                record = records.get(r.slot)
                recorded = None if record is None else record.load()
                own = None if recorded is None else rerun.judge(r.slot, recorded)
                if own is None:
                    checked = False
                    continue
                if own.verdict == "fail":
                    reason = (
                        f"{r.slot} differs from a rerun of the call from its own recorded "
                        f"inputs beyond {dtype_name(own.dtype)} rounding: {own.reason}"
                    )
                    return _divergence(target, golden, "rerun", reason, r), checked
        except NotReplayable:  # the rerun at the recorded dtypes an index needs
            return None, False
        return None, checked


@dataclass
class _Suspicion:
    """An input out of code only one run has, waiting for what leaves its module."""

    divergence: Divergence
    #: the last target call inside the module so far
    last: Call | None = None


def _within(module: str | None, path: str) -> bool:
    return module is not None and (not path or module == path or module.startswith(path + "."))


#: Causes that are reported only when no other call is guilty.
_WEAK = frozenset({"amplification"})


#: Content identity within one rank of one dump.
_Key = tuple[int, tuple[object, ...] | None]


#: Weights of a run that keeps its dtypes: their statistics agree up to summation order.
_SAME_SUM = 1e-12


def _inside_paths(rank: int, module: str) -> Callable[[tuple[int, str]], bool]:
    prefix = module + "."
    return lambda key: (
        key[0] == rank and (not module or key[1] == module or key[1].startswith(prefix))
    )


def _differing_elements(target: torch.Tensor, golden: torch.Tensor) -> int:
    """Elements of ``target`` that are not bitwise the golden's cast to the target's dtype."""
    cast = golden.to(target.dtype)
    if torch.equal(target, cast):
        return 0
    same = (target == cast) | (target.isnan() & cast.isnan())
    return int((~same).sum())


def _equivalent_spelling(r: RecordComparison, identical: bool) -> RecordComparison:
    """A non-tensor argument of a call whose outputs match: one side spelling out a default
    (the outputs pass), or another way to write the same call (``transpose(2, 3)`` for
    ``(-1, -2)``: the outputs are identical; an eps of 1e-5 for 1e-6 changes them a little)."""
    if not (r.failed and _is_input(r.slot) and r.golden_dtype is None and r.target_dtype is None):
        return r
    one_sided = r.reason.startswith("only the")
    if not (one_sided or identical):
        return r
    return replace(r, status="warn", reason=f"{r.reason} (the outputs match: the same call)")


def _join(module: str | None, name: str) -> str:
    return f"{module}.{name}" if module else name


def _is_input(slot: str) -> bool:
    return slot.startswith(("input", "kwargs"))


def _divergence(
    target: Call, golden: Call, cause: Cause, reason: str, record: RecordComparison
) -> Divergence:
    return Divergence(
        name=target.name,
        golden_name=golden.name,
        module=target.module,
        layer=layer_of(target.module),
        rank=target.rank,
        step=target.step,
        cause=cause,
        reason=reason,
        record=record,
    )


def _row(
    golden: Call,
    target: Call,
    slot: str,
    status: Status,
    reason: str,
    g: Record | None = None,
    t: Record | None = None,
    metrics: TensorComparison | StatsComparison | None = None,
) -> RecordComparison:
    return RecordComparison(
        name=target.name,
        golden_name=golden.name,
        slot=slot,
        kind=target.kind,
        op=target.op,
        module=target.module,
        rank=target.rank,
        step=target.step,
        status=status,
        reason=reason,
        golden_dtype=None if g is None else g.dtype,
        target_dtype=None if t is None else t.dtype,
        shape=(t or g).shape if (t or g) is not None else None,  # type: ignore[union-attr]
        metrics=metrics,
    )


def _fingerprint(record: Record | None) -> tuple[object, ...] | None:
    """Content identity within one dump: checksum where recorded, else exact statistics."""
    if record is None or not record.is_tensor:
        return None
    if record.checksum is not None:
        return (record.dtype, record.shape, record.checksum)
    if record.stats is not None:
        return (record.dtype, record.shape, *_stats_key(record.stats))
    return None


def _stats_key(stats: TensorStats) -> tuple[object, ...]:
    # NaN != NaN: a tensor with no finite element still fingerprints equal to itself
    return tuple(
        "nan" if isinstance(v, float) and math.isnan(v) else v for v in vars(stats).values()
    )


def _stats_difference(golden: TensorStats, target: TensorStats) -> StatsComparison:
    rms = golden.norm / math.sqrt(golden.numel) if golden.numel else 0.0
    scale = rms if rms > 0 and math.isfinite(rms) else 1.0

    def relative(a: float, b: float, denominator: float) -> float:
        if math.isnan(a) and math.isnan(b):
            return 0.0
        difference = abs(a - b)
        return difference / denominator if math.isfinite(difference) else math.inf

    non_finite = (golden.nan_count, golden.posinf_count, golden.neginf_count) != (
        target.nan_count,
        target.posinf_count,
        target.neginf_count,
    )
    return StatsComparison(
        max_diff=relative(target.max, golden.max, _at_least(abs(golden.max), scale)),
        min_diff=relative(target.min, golden.min, _at_least(abs(golden.min), scale)),
        mean_diff=relative(target.mean, golden.mean, scale),
        norm_diff=relative(target.norm, golden.norm, golden.norm if golden.norm > 0 else 1.0),
        non_finite_differs=non_finite,
    )


def _at_least(value: float, floor: float) -> float:
    return value if value > floor and math.isfinite(value) else floor


def _non_finite(stats: TensorStats) -> str:
    return f"{stats.nan_count} NaN, {stats.posinf_count} +Inf, {stats.neginf_count} -Inf"


def _same_value(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def _float_dtype(value: object) -> torch.dtype | None:
    """A floating dtype as recorded (``torch.bfloat16`` natively, ``bfloat16`` elsewhere)."""
    if not isinstance(value, str):
        return None
    dtype = getattr(torch, value.removeprefix("torch."), None)
    return dtype if isinstance(dtype, torch.dtype) and dtype.is_floating_point else None


def _is_device(value: object) -> bool:
    """A device as recorded: ``"cpu"``, ``"cuda:0"``, ``"npu:1"``."""
    if not isinstance(value, str) or not value:
        return False
    try:
        torch.device(value)
    except (RuntimeError, ValueError):
        return False
    return True
