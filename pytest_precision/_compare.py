"""Dump against dump: align the calls, compare every record, find where the error started.

Calls are aligned by what they are (kind, op, module), not by their names: one extra op in the
target shifts every later call counter (``Functional.linear.7`` becomes ``.8``), which must not
turn into dozens of false differences. Then the target is walked in the order calls finished
(an op before the module around it, a layer's modules before the layer). Each call's records
are judged by the standard of the lowest precision among them (bf16 data a call upcasts to fp32
is still bf16 data), and the call is judged for guilt, not for difference. Its cause is:

- ``source``: an input that no earlier call produced differs (a weight, a buffer, a model
  input, or a constant argument such as a softmax scale or a slice);
- ``wiring``: an input is the output of a different call than in the golden;
- ``unmatched``: an input comes from a call the golden does not make (different code);
- ``rerun``: an output differs, and rerunning the call in float64 from the target's own
  recorded inputs shows that it added error beyond the rounding of its dtype;
- ``output``: an output differs although the inputs (and, for a module, the weights inside it)
  match exactly, and the call cannot be rerun (statistics-only dump, module, unknown op);
- ``amplification`` (weak evidence, reported only when nothing else is found): inputs differ
  slightly, the call cannot be rerun, and its output's error level is more than
  :data:`AMPLIFICATION` times its inputs'.

A call whose output differs only because its inputs did is innocent: that is accumulated
rounding (noise), as in a bf16 run compared with an fp32 one.
"""

from __future__ import annotations

import difflib
import math
import os
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch

from ._errors import PrecisionError, PrecisionInputError
from ._metrics import TensorStats, lower_precision
from ._standards import (
    Reference,
    Standard,
    StandardName,
    TensorComparison,
    judge_pair,
    judge_rounding,
    resolve_standard,
)
from .dump._load import load_dump
from .dump._records import Call, Dump, Record

#: A drifting call that cannot be rerun is suspected only when its output's error level exceeds
#: this many times its inputs'. Rounding noise amplifies less: bf16 and fp16 runs of the tiny
#: Llama against fp32 (2 and 4 layers, 8 and 32 tokens, tensor and statistics dumps) reached 12x.
AMPLIFICATION = 100.0

#: ``model.layers.3``, ``transformer.h.3``, ``encoder.layer.3``, ``blocks.3``: the layer a module
#: path belongs to.
_LAYER = re.compile(r"^(.*?\b(?:layers|layer|h|blocks|block)\.\d+)(?:\.|$)")

Status = Literal["pass", "warn", "fail", "skip"]
Cause = Literal["source", "wiring", "unmatched", "output", "rerun", "amplification"]


@dataclass(frozen=True)
class StatsComparison:
    """Two statistics summaries compared (a statistics-only dump has nothing else).

    Each difference is relative to the golden's value, but never to less than the golden's
    root mean square (a mean near zero has no useful relative error).
    """

    max_diff: float
    min_diff: float
    mean_diff: float
    norm_diff: float
    non_finite_differs: bool

    @property
    def error_level(self) -> float:
        return max(self.max_diff, self.min_diff, self.mean_diff, self.norm_diff)


@dataclass(frozen=True)
class RecordComparison:
    """One slot of one aligned call: the target's record against the golden's."""

    name: str
    golden_name: str
    slot: str
    kind: str
    op: str
    module: str | None
    rank: int
    step: int
    status: Status
    reason: str
    golden_dtype: str | None = None
    target_dtype: str | None = None
    shape: tuple[int, ...] | None = None
    metrics: TensorComparison | StatsComparison | None = None

    @property
    def error_level(self) -> float:
        """Relative size of the difference (relative RMS error for tensors), 0 if identical;
        what drift amplification is measured in."""
        if isinstance(self.metrics, TensorComparison):
            sqnr = self.metrics.sqnr_db  # +inf when identical, -inf or nan for a zero signal
            if sqnr == math.inf:
                return 0.0
            return 10 ** (-sqnr / 20) if math.isfinite(sqnr) else math.inf
        if isinstance(self.metrics, StatsComparison):
            return self.metrics.error_level
        return 0.0 if self.status in ("pass", "skip") else math.inf

    @property
    def failed(self) -> bool:
        return self.status == "fail"

    def to_dict(self) -> dict[str, object]:
        """A flat, JSON- and CSV-ready row."""
        row: dict[str, object] = {
            "name": self.name,
            "golden_name": self.golden_name,
            "slot": self.slot,
            "module": self.module,
            "rank": self.rank,
            "step": self.step,
            "status": self.status,
            "reason": self.reason,
            "golden_dtype": self.golden_dtype,
            "target_dtype": self.target_dtype,
            "shape": None if self.shape is None else list(self.shape),
            "error_level": _finite_or_text(self.error_level),
        }
        if isinstance(self.metrics, TensorComparison):
            m = self.metrics
            for key in ("cosine", "max_abs_err", "max_rel_err", "rmse", "sqnr_db"):
                row[key] = _finite_or_text(getattr(m, key))
            row["thousandth_ratio"] = m.thousandth_ratio
            row["max_abs_index"] = list(m.max_abs_index) if m.max_abs_index else None
        elif isinstance(self.metrics, StatsComparison):
            for key in ("max_diff", "min_diff", "mean_diff", "norm_diff"):
                row[key] = _finite_or_text(getattr(self.metrics, key))
        return row


@dataclass(frozen=True)
class Divergence:
    """Where the target started to go wrong: the guilty call, its module and layer, and why."""

    name: str
    golden_name: str
    module: str | None
    layer: str | None
    rank: int
    step: int
    cause: Cause
    reason: str
    #: the failing record that convicts the call (an output, or the drifting source input)
    record: RecordComparison

    @property
    def metrics(self) -> TensorComparison | StatsComparison | None:
        return self.record.metrics


@dataclass(frozen=True)
class UnmatchedCall:
    """A call one dump has and the other does not (an added, removed or fused op)."""

    side: Literal["golden", "target"]
    name: str
    module: str | None
    rank: int
    step: int


@dataclass
class DumpComparison:
    """The result of :func:`compare_dumps`."""

    golden: Dump
    target: Dump
    records: list[RecordComparison]
    first_divergence: Divergence | None
    unmatched: list[UnmatchedCall] = field(default_factory=list)
    matched_calls: int = 0
    #: calls whose inputs drifted and outputs failed that could not be rerun: judged innocent
    #: because they did not amplify the drift, not because a rerun cleared them
    unverified: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.first_divergence is None

    def counts(self) -> dict[Status, int]:
        out: dict[Status, int] = {"pass": 0, "warn": 0, "fail": 0, "skip": 0}
        for record in self.records:
            out[record.status] += 1
        return out

    def report(self, *, worst: int = 5) -> str:
        """The terminal summary: what was compared, the first divergence, the worst records."""
        from .report._dumps import dump_comparison_text

        return dump_comparison_text(self, worst=worst)

    def write_json(self, path: str | os.PathLike[str]) -> None:
        from .report._dumps import write_dump_comparison_json

        write_dump_comparison_json(self, Path(path))

    def write_csv(self, path: str | os.PathLike[str]) -> None:
        from .report._dumps import write_dump_comparison_csv

        write_dump_comparison_csv(self, Path(path))


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
    segments = _segments(golden_dump.calls, target_dump.calls)
    total = sum(len(walk) for walk, _ in segments.values())
    result = DumpComparison(golden_dump, target_dump, [], None)
    strong: Divergence | None = None
    suspect: Divergence | None = None
    done = 0
    for walk, golden_only in segments.values():
        result.unmatched.extend(_unmatched("golden", golden_only))
        judge = _Judge(standard, [t for _, t in walk])
        for g, t in walk:
            if g is None:
                result.unmatched.extend(_unmatched("target", [t]))
                judge.remember_unmatched(t)
            else:
                result.matched_calls += 1
                compared = judge.compare_call(g, t)
                result.records.extend(compared)
                if strong is None:
                    found = judge.verdict(g, t, compared)
                    if found is not None and found.cause == "amplification":
                        suspect = suspect or found
                    elif found is not None:
                        strong = found
                judge.remember_outputs(g, t, compared)
            done += 1
            if progress is not None:
                progress(done, total)
        result.unverified.extend(judge.unverified)
    # Amplification is weak evidence: a call whose inputs match and whose output does not,
    # even later, is the better answer.
    result.first_divergence = strong or suspect
    return result


def as_dump(value: Dump | str | os.PathLike[str]) -> Dump:
    if isinstance(value, Dump):
        return value
    if isinstance(value, (str, os.PathLike)):
        return load_dump(value)
    raise PrecisionInputError(f"expected a Dump or a path to one, got {type(value).__name__}")


# -- alignment -------------------------------------------------------------------------------------


def _signature(call: Call) -> tuple[str, str, str | None]:
    """What a call is, without its counter: ``x @ w`` is ``Tensor.matmul`` in our captures and
    ``Tensor.__matmul__`` in msprobe's, so dunders are stripped."""
    op = call.op[2:-2] if call.op.startswith("__") and call.op.endswith("__") else call.op
    module = call.module if call.kind == "Module" else None
    return call.kind, op, module


#: target calls in the order they finished, each with its golden partner (None: unmatched),
#: and the golden calls without a partner
_Segment = tuple[list[tuple[Call | None, Call]], list[Call]]


def _segments(golden: Sequence[Call], target: Sequence[Call]) -> dict[tuple[int, int], _Segment]:
    """Each (step, rank)'s aligned walk, in step then rank order."""
    by_key: dict[tuple[int, int], tuple[list[Call], list[Call]]] = {}
    for side, calls in ((0, golden), (1, target)):
        for call in calls:
            by_key.setdefault((call.step, call.rank), ([], []))[side].append(call)
    return {key: _align(*by_key[key]) for key in sorted(by_key)}


def _align(golden: list[Call], target: list[Call]) -> _Segment:
    matcher = difflib.SequenceMatcher(
        None, [_signature(c) for c in golden], [_signature(c) for c in target], autojunk=False
    )
    partner: dict[int, Call] = {}
    golden_only: list[Call] = []
    for tag, g0, g1, t0, t1 in matcher.get_opcodes():
        if tag == "equal":
            partner.update((id(t), g) for g, t in zip(golden[g0:g1], target[t0:t1], strict=True))
        else:
            golden_only.extend(golden[g0:g1])
    return [(partner.get(id(t)), t) for t in _completion_order(target)], golden_only


def _unmatched(side: Literal["golden", "target"], calls: Iterable[Call]) -> Iterator[UnmatchedCall]:
    for c in calls:
        yield UnmatchedCall(side, c.name, c.module, c.rank, c.step)


def _completion_order(calls: list[Call]) -> list[Call]:
    """A module call finishes when every call inside it did; ops finish where they start."""
    out: list[Call] = []
    open_modules: list[Call] = []
    for call in calls:
        while open_modules and not _inside(call, open_modules[-1]):
            out.append(open_modules.pop())
        if call.kind == "Module":
            open_modules.append(call)
        else:
            out.append(call)
    out.extend(reversed(open_modules))
    return out


def _inside(call: Call, module_call: Call) -> bool:
    path, module = call.module, module_call.module
    if path is None or module is None:
        return False
    if call.kind == "Module":  # the same module called again is a sibling, not a child
        return path.startswith(module + ".") or (module == "" and path != "")
    return module == "" or path == module or path.startswith(module + ".")


# -- judging -------------------------------------------------------------------------------------


def layer_of(module: str | None) -> str | None:
    """The decoder layer a module path belongs to (``model.layers.1`` for its attention's
    ``o_proj``), or ``None`` outside any layer."""
    if module is None:
        return None
    match = _LAYER.match(module)
    return match.group(1) if match else None


class _Judge:
    """Compares the records of aligned calls and decides guilt, remembering what earlier calls
    produced (by content) so that a drifting input can be told from a drifting source."""

    def __init__(
        self, standard: Standard | StandardName | None, target_calls: Sequence[Call]
    ) -> None:
        self.standard = standard
        self.op_level = any(c.kind != "Module" for c in target_calls)
        #: outputs of the calls judged so far, by content: the target's with how they compared,
        #: the golden's by (call name, slot)
        #: (several calls may produce the same content: ``x.to(x.dtype)`` returns ``x``)
        self.produced: dict[tuple[object, ...] | None, list[RecordComparison]] = {}
        self.golden_produced: dict[tuple[object, ...] | None, set[tuple[str, str]]] = {}
        self.unmatched_outputs: dict[tuple[object, ...] | None, str] = {}
        #: error level of the parameters compared so far, by module path
        self.parameter_levels: dict[str, float] = {}
        #: module parameters by content, to name the weight an op received
        self.parameters = {
            fingerprint: _join(c.module, r.slot.removeprefix("parameters."))
            for c in target_calls
            for r in c.parameters
            if (fingerprint := _fingerprint(r)) is not None
        }
        #: drifting calls with failing outputs that could be neither rerun nor convicted
        self.unverified: list[str] = []
        #: comparisons of stored tensor pairs, by (golden data id, target data id, dtype)
        self.judged: dict[tuple[str, str, torch.dtype], TensorComparison] = {}

    # -- records ---------------------------------------------------------------------------------

    def compare_call(self, golden: Call, target: Call) -> list[RecordComparison]:
        """Every slot of the pair, judged by the standard of the lowest precision among all the
        call's tensors: bf16 data a call upcast to fp32 is still bf16 data."""
        golden_slots = {r.slot: r for r in golden.records}
        precision = lowest_float((*golden.records, *target.records))
        out = []
        for t in target.records:
            g = golden_slots.pop(t.slot, None)
            out.append(self._compare_record(golden, target, g, t, precision))
        for g in golden_slots.values():
            out.append(_row(golden, target, g.slot, "fail", "only the golden has this slot"))
        return out

    def _compare_record(
        self, golden: Call, target: Call, g: Record | None, t: Record, precision: torch.dtype
    ) -> RecordComparison:
        if g is None:
            return _row(golden, target, t.slot, "fail", "only the target has this slot", t=t)
        if not (g.is_tensor and t.is_tensor):
            if g.is_tensor or t.is_tensor:
                return _row(golden, target, t.slot, "fail", "a tensor on one side only", g, t)
            if _same_value(g.value, t.value):
                return _row(golden, target, t.slot, "pass", "same value", g, t)
            reason = f"{t.value!r} vs {g.value!r}"
            if _is_float_dtype(g.value) and _is_float_dtype(t.value):
                # a bf16 run against an fp32 one passes its own dtype everywhere; the values
                # show whether that matters, so this alone convicts nothing
                return _row(golden, target, t.slot, "warn", f"dtype {reason}", g, t)
            return _row(golden, target, t.slot, "fail", reason, g, t)
        if g.shape != t.shape:
            return _row(golden, target, t.slot, "fail", f"shape {t.shape} vs {g.shape}", g, t)
        dtype = _judging_dtype(g, t, precision)
        if g.loader is not None and t.loader is not None:
            try:
                metrics = self._judge_records(g, t, dtype)
            except PrecisionInputError as exc:
                return _row(golden, target, t.slot, "fail", str(exc), g, t)
            return _row(golden, target, t.slot, metrics.verdict, metrics.reason, g, t, metrics)
        if g.stats is not None and t.stats is not None:
            return self._compare_stats(golden, target, g, t, g.stats, t.stats, dtype)
        return _row(golden, target, t.slot, "skip", "no data or statistics to compare", g, t)

    def _judge_records(self, g: Record, t: Record, dtype: torch.dtype) -> TensorComparison:
        """Compare the stored tensors, once per pair of stored data: a weight is recorded as a
        module's parameter and as the input of its op, an activation as a module's output and
        as the next call's input."""
        key = None if g.data_id is None or t.data_id is None else (g.data_id, t.data_id, dtype)
        known = self.judged.get(key) if key is not None else None
        if known is None:
            assert g.loader is not None
            assert t.loader is not None
            known = self._judge(t.loader(), g.loader(), dtype)
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
    ) -> RecordComparison:
        """Statistics within the standard's relative tolerance: a tensor within it elementwise
        has statistics within it too."""
        stats = _stats_difference(golden_stats, target_stats)
        rtol, _ = resolve_standard(self.standard, dtype).tolerances(dtype)
        if dtype.is_floating_point:
            rtol = max(rtol, torch.finfo(dtype).eps)
        if stats.non_finite_differs:
            reason = (
                f"NaN/Inf counts differ: {_non_finite(target_stats)} vs {_non_finite(golden_stats)}"
            )
            return _row(golden, target, t.slot, "fail", reason, g, t, stats)
        worst = max(("max", "min", "mean", "norm"), key=lambda k: getattr(stats, f"{k}_diff"))
        level = getattr(stats, f"{worst}_diff")
        verdict: Status = "pass" if level <= rtol else "fail"
        reason = f"statistics differ by up to {level:.3g} ({worst}; tolerance {rtol:.3g})"
        return _row(golden, target, t.slot, verdict, reason, g, t, stats)

    # -- guilt ---------------------------------------------------------------------------------

    def remember_outputs(
        self, golden: Call, target: Call, compared: list[RecordComparison]
    ) -> None:
        """Index both calls' outputs by content, so that a later input's producer is known."""
        by_slot = {r.slot: r for r in compared}
        for record in target.outputs:
            fingerprint = _fingerprint(record)
            if fingerprint is not None and record.slot in by_slot:
                self.produced.setdefault(fingerprint, []).append(by_slot[record.slot])
        for record in golden.outputs:
            fingerprint = _fingerprint(record)
            if fingerprint is not None:
                self.golden_produced.setdefault(fingerprint, set()).add((golden.name, record.slot))

    def remember_unmatched(self, target: Call) -> None:
        """A call only the target makes: what it produces has no golden counterpart."""
        for record in target.outputs:
            fingerprint = _fingerprint(record)
            if fingerprint is not None:
                self.unmatched_outputs.setdefault(fingerprint, target.name)

    def verdict(
        self, golden: Call, target: Call, compared: list[RecordComparison]
    ) -> Divergence | None:
        """The divergence this call is guilty of, if any (see the module docstring)."""
        for r in compared:
            if r.slot.startswith("parameters"):
                if r.failed:
                    return _divergence(target, golden, "source", self._source_reason(r, None), r)
                level = self.parameter_levels.get(r.module or "", 0.0)
                self.parameter_levels[r.module or ""] = max(level, r.error_level)
        records = {r.slot: r for r in target.records}
        golden_records = {r.slot: r for r in golden.records}
        inputs = [r for r in compared if _is_input(r.slot)]
        for r in inputs:
            record = records.get(r.slot)
            if not r.failed or record is None:
                continue
            producers = self.produced.get(_fingerprint(record), [])
            stranger = self.unmatched_outputs.get(_fingerprint(record))
            if not producers and stranger is not None:
                reason = (
                    f"{r.slot} differs from the golden's and comes from {stranger}, a call the "
                    f"golden does not make: the two runs execute different ops here ({r.reason})"
                )
                return _divergence(target, golden, "unmatched", reason, r)
            if not producers and self._is_source(record):
                reason = self._source_reason(r, record)
                return _divergence(target, golden, "source", reason, r)
            expected = self.golden_produced.get(_fingerprint(golden_records.get(r.slot)))
            if (
                producers
                and expected
                and not {(p.golden_name, p.slot) for p in producers} & expected
            ):
                producer, (name, slot) = producers[-1], min(expected)
                reason = (
                    f"{r.slot} is {producer.name}'s {producer.slot}, but in the golden it is "
                    f"{name}'s {slot}: the call received a different tensor"
                )
                return _divergence(target, golden, "wiring", reason, r)
        failing = [r for r in compared if r.slot.startswith("output") and r.failed]
        if not failing:
            return None
        if target.kind == "Module" and self.op_level:
            return None  # the ops inside it were judged one by one
        return self._judge_output(golden, target, inputs, failing)

    def _parameter_level(self, module: str) -> float:
        """The largest error level among the parameters of ``module`` and its submodules."""
        inside = module + "."
        return max(
            (
                level
                for path, level in self.parameter_levels.items()
                if not module or path == module or path.startswith(inside)
            ),
            default=0.0,
        )

    def _is_source(self, record: Record) -> bool:
        """An input that no earlier call produced. In a module-level dump, glue code between
        modules (a residual add) is not recorded, so only non-tensor values count there."""
        return not record.is_tensor or self.op_level

    def _source_reason(self, r: RecordComparison, record: Record | None) -> str:
        if record is None:  # a module's own parameter
            what = f"parameter {_join(r.module, r.slot.removeprefix('parameters.'))}"
        elif not record.is_tensor:
            what = f"argument {r.slot}"
        else:
            owner = self.parameters.get(_fingerprint(record))
            what = f"{r.slot} (parameter {owner})" if owner else f"input {r.slot}"
        return (
            f"{what} differs from the golden and no earlier call produced it "
            f"(a weight, buffer, constant or model input): {r.reason}"
        )

    def _judge_output(
        self,
        golden: Call,
        target: Call,
        inputs: list[RecordComparison],
        failing: list[RecordComparison],
    ) -> Divergence | None:
        """An output fails: guilty if the call added error of its own. A rerun in float64 from
        the target's own recorded inputs tells; without one, identical inputs convict, and
        drifting inputs convict only if the call amplified their error."""
        from ._replay import NotReplayable, recompute

        worst = max(failing, key=lambda r: r.error_level)
        try:
            rerun = recompute(target) if target.kind != "Module" else None
        except NotReplayable as exc:
            rerun, why_not = None, str(exc)
        else:
            why_not = "a module is not rerun"
        if rerun is not None:
            return self._judge_rerun(golden, target, failing, rerun)
        before = max((r.error_level for r in inputs), default=0.0)
        if target.kind == "Module":  # weights inside it are inputs too
            before = max(before, self._parameter_level(target.module or ""))
        after = worst.error_level
        if before == 0.0:
            reason = f"its inputs match the golden exactly, {worst.slot} does not: {worst.reason}"
            return _divergence(target, golden, "output", reason, worst)
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
        rerun: dict[str, torch.Tensor],
    ) -> Divergence | None:
        records = {r.slot: r for r in target.outputs}
        precision = lowest_float(target.records)
        for r in failing:
            recorded, exact = records[r.slot].load(), rerun.get(r.slot)
            if recorded is None or exact is None or recorded.shape != exact.shape:
                continue
            own = judge_rounding(recorded, exact, precision)
            if own.verdict == "fail":
                reason = (
                    f"{r.slot} differs from a float64 rerun of the call from its own recorded "
                    f"inputs beyond {str(precision).removeprefix('torch.')} rounding: {own.reason}"
                )
                return _divergence(target, golden, "rerun", reason, r)
        return None  # it only carried differences it received


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


def _is_float_dtype(value: object) -> bool:
    """A floating dtype as recorded: ``torch.bfloat16`` (native) or ``bfloat16``."""
    if not isinstance(value, str):
        return False
    dtype = getattr(torch, value.removeprefix("torch."), None)
    return isinstance(dtype, torch.dtype) and dtype.is_floating_point


def _torch_dtype(name: str | None) -> torch.dtype:
    dtype = getattr(torch, name or "", None)
    if not isinstance(dtype, torch.dtype):
        raise PrecisionError(f"unknown dtype {name!r} in a dump record")
    return dtype


def lowest_float(records: Iterable[Record]) -> torch.dtype:
    """The floating dtype with the fewest significand bits among ``records`` (float64 if none)."""
    lowest = torch.float64
    for record in records:
        if record.dtype is not None:
            dtype = _torch_dtype(record.dtype)
            if dtype.is_floating_point:
                lowest = lower_precision(lowest, dtype)
    return lowest


def _judging_dtype(g: Record, t: Record, precision: torch.dtype) -> torch.dtype:
    """The call's lowest precision for a float pair; the pair's own dtype otherwise (integers
    and bools compare exactly)."""
    pair = lower_precision(_torch_dtype(g.dtype), _torch_dtype(t.dtype))
    return precision if pair.is_floating_point else pair


def _finite_or_text(value: float) -> float | str:
    return value if math.isfinite(value) else str(value)
