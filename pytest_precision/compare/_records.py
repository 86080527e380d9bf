"""Compare the records of one aligned call pair: every slot, tensor, statistics or value.

A tensor pair is judged by the standard of its judging dtype (the lower precision of the two,
never more than the run's), a statistics-only pair by its statistics, a non-tensor argument by
equality. A weight is data, not a computation: any element that differs fails it.
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch

from .._errors import PrecisionInputError
from ..dump._records import GARBAGE_MEMORY, Call, Record
from ..numerics._comparison import TensorComparison, resolve_standard
from ..numerics._dtypes import dtype_from_name, dtype_name
from ..numerics._standards import Standard, StandardName
from ..numerics._stats import TensorStats
from ..numerics._stats_rounding import StatScales
from ._measurements import Measurements
from ._one_rounding import judge_one_rounding
from ._outputs import code_difference, judged_in
from ._padding import uncut_outputs
from ._precision import RunPrecision
from ._provenance import ALLOCATIONS, Provenance
from ._results import RecordComparison, StatsComparison, Status, evidence, is_input

#: Weights of a run that keeps its dtypes: their statistics agree up to summation order.
_SAME_SUM = 1e-12

#: An output whose error level is within this factor of its inputs' passed their error on
#: (a reshape's output holds its input's values: the same level, up to summation order).
_CARRIED = 1.0 + 1e-9
#: how many roundings of its dtype one element of a spelled-differently call may move
_ROUNDINGS = 4


class RecordComparer:
    """Compares the records of aligned calls. A pure function of the two calls: what it reads
    from tensors comes from ``measurements``, what depends on the walk (which inputs hold
    uninitialized memory) was worked out from the dumps' metadata beforehand."""

    def __init__(
        self,
        standard: Standard | StandardName | None,
        precision: RunPrecision,
        provenance: Provenance,
        measurements: Measurements,
        uninitialized: frozenset[tuple[int, int, str, str]],
        *,
        exact_weight_stats: bool,
    ) -> None:
        self.standard = standard
        self.precision = precision
        #: names the weights an op receives: a weight input is judged as a weight
        self.provenance = provenance
        self.measurements = measurements
        #: inputs holding what an ``empty*`` call returned, by (rank, step, call name, slot)
        self.uninitialized = uninitialized
        #: weights' statistics must agree to 1e-12 (both dumps computed them in float64)
        self.exact_weight_stats = exact_weight_stats

    def compare_call(self, golden: Call, target: Call) -> list[RecordComparison]:
        """Every slot of the pair."""
        golden_slots = {r.slot: r for r in golden.records}
        out = []
        for t in target.records:
            g = golden_slots.pop(t.slot, None)
            out.append(self.compare_record(golden, target, g, t))
        for g in golden_slots.values():
            row = _row(golden, target, g.slot, "fail", "only the golden has this slot", g)
            out.append(replace(row, incomparable=True))
        out = uncut_outputs(
            target,
            self._skip_uninitialized(target, out),
            lambda: target.kind != "Module" and self.measurements.refusal(target) is None,
        )
        out = judge_one_rounding(golden, target, out, stats_in_float64=self.exact_weight_stats)
        if any(_argument_difference(r) for r in out) and self._same_call(out, target.kind):
            out = [_spelling(r) if _argument_difference(r) else r for r in out]
        return out

    def _same_call(self, compared: list[RecordComparison], kind: str) -> bool:
        """Whether arguments that differ (not tensors on both sides) spell the same call
        another way. The values decide: the outputs are identical; or they pass and the
        differences are defaults one side spells out (msprobe does not record
        ``_stacklevel``); or each output adds nothing of its own to what the call received
        (:meth:`_adds_nothing`: a reshape's ``-1`` for ``4`` passes on the drift of an
        attention computed another way). An eps or a scale that moves the output beyond that
        is a value, not a spelling."""
        outputs = evidence([r for r in compared if r.slot.startswith("output")])
        if not outputs:
            return False
        if all(r.error_level == 0.0 for r in outputs):
            return True
        differing = [r for r in compared if _argument_difference(r)]
        if not any(r.failed for r in outputs) and all(_one_sided(r) for r in differing):
            return True
        received = max(
            (r.error_level for r in compared if is_input(r.slot) and r.metrics is not None),
            default=0.0,
        )
        module = kind == "Module"
        return all(self._adds_nothing(r, received, module=module) for r in outputs)

    def _adds_nothing(self, r: RecordComparison, received: float, *, module: bool) -> bool:
        """An output no further from the golden's than its call's inputs are from theirs
        (``received``: their largest error level; 0 when they match), or than two roundings
        of its dtype (two machines rounding the same value) in every element, not only on
        average (a mask dropped at one decode row moves a few elements by 1e-4 and the RMS by
        less than a rounding); a module's, than reordered rounding (it holds many roundings,
        and an attention that takes no mask is another implementation of the same layer)."""
        level = r.error_level
        if r.status == "skip" or level == 0.0 or level <= received * _CARRIED:
            return True
        if module:
            return not code_difference(r, self.precision)
        eps = torch.finfo(judged_in(r, self.precision)).eps
        m = r.metrics
        if isinstance(m, TensorComparison) and m.max_rel_err > _ROUNDINGS * eps:
            return m.max_abs_err <= _ROUNDINGS * eps * m.expected_rms
        return level <= eps

    def _skip_uninitialized(
        self, target: Call, out: list[RecordComparison]
    ) -> list[RecordComparison]:
        """``empty*`` allocates without writing: its output is whatever the memory held, and
        so is the input of the call that fills it in place (a grouped MoE matmul's ``out=``).
        Neither is data: comparing them convicts the allocation."""
        return [
            replace(r, status="skip", reason="uninitialized memory (an empty* allocation)")
            if (r.slot.startswith("output") and target.op in ALLOCATIONS)
            or (target.rank, target.step, target.name, r.slot) in self.uninitialized
            else r
            for r in out
        ]

    def compare_record(
        self, golden: Call, target: Call, g: Record | None, t: Record
    ) -> RecordComparison:
        """One slot: ``g`` is the golden's record of it, if the golden has one."""
        if g is None:
            row = _row(golden, target, t.slot, "fail", "only the target has this slot", t=t)
            return replace(row, incomparable=True)
        memory = next((m for m in (t.memory, g.memory) if m in GARBAGE_MEMORY), None)
        if memory is not None:  # garbage on one side: not data
            reason = f"uninitialized memory ({memory} since an empty* allocation)"
            return _row(golden, target, t.slot, "skip", reason, g, t)
        if not (g.is_tensor and t.is_tensor):
            if g.is_tensor or t.is_tensor:
                row = _row(golden, target, t.slot, "fail", "a tensor on one side only", g, t)
                return replace(row, incomparable=True)
            return self._compare_values(golden, target, g, t)
        if g.shape != t.shape:
            sizes = (math.prod(g.shape or ()), math.prod(t.shape or ()))
            if t.slot.startswith("parameters") and g.shape and t.shape and 0 in sizes:
                # vLLM CPU hands a bf16 linear's weight to oneDNN and leaves an empty parameter
                reason = "an empty parameter on one side (its weights packed elsewhere)"
                return _row(golden, target, t.slot, "skip", reason, g, t)
            row = _row(golden, target, t.slot, "fail", f"shape {t.shape} vs {g.shape}", g, t)
            return replace(row, incomparable=True)
        g_dtype, t_dtype = dtype_from_name(g.dtype), dtype_from_name(t.dtype)
        dtype = self.precision.judging_dtype(g_dtype, t_dtype)
        weight = (
            t.slot.startswith("parameters") or self.provenance.parameter_name(t.rank, t) is not None
        )
        if g.loader is not None and t.loader is not None:
            try:
                metrics = self.measurements.pair(g, t, dtype, weight)
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
        run_dtype = self.precision.target
        if self.precision.crosses and run_dtype and _in_dtype(g.value, t.value, run_dtype):
            why = f"{reason} (the golden's value in {dtype_name(run_dtype)})"
            return _row(golden, target, t.slot, "warn", why, g, t)
        return _row(golden, target, t.slot, "fail", reason, g, t)

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
            return _row(golden, target, t.slot, "fail", reason, g, t, stats)
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


def _argument_difference(r: RecordComparison) -> bool:
    """A failing argument that is not a tensor on both sides: another value, a slot only one
    side has, a tensor where the other side passes None (a mask)."""
    return r.failed and is_input(r.slot) and (r.golden_dtype is None or r.target_dtype is None)


def _one_sided(r: RecordComparison) -> bool:
    return r.reason.startswith("only the")


def _spelling(r: RecordComparison) -> RecordComparison:
    return replace(r, status="warn", reason=f"{r.reason} (the outputs match: the same call)")


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


def _stats_difference(golden: TensorStats, target: TensorStats) -> StatsComparison:
    scales = StatScales.of(golden)

    def relative(a: float, b: float, denominator: float) -> float:
        # an overflowing reduction (msprobe sums in the tensor's dtype) is the same overflow
        if a == b or (math.isnan(a) and math.isnan(b)):
            return 0.0
        difference = abs(a - b)
        return difference / denominator if math.isfinite(difference) else math.inf

    non_finite = (golden.nan_count, golden.posinf_count, golden.neginf_count) != (
        target.nan_count,
        target.posinf_count,
        target.neginf_count,
    )
    return StatsComparison(
        max_diff=relative(target.max, golden.max, scales.max),
        min_diff=relative(target.min, golden.min, scales.min),
        mean_diff=relative(target.mean, golden.mean, scales.mean),
        norm_diff=relative(target.norm, golden.norm, scales.norm),
        non_finite_differs=non_finite,
    )


def _non_finite(stats: TensorStats) -> str:
    return f"{stats.nan_count} NaN, {stats.posinf_count} +Inf, {stats.neginf_count} -Inf"


def _same_value(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def _in_dtype(golden: object, target: object, dtype: torch.dtype) -> bool:
    """A float constant the target computed from its own dtype: the golden's value cast to
    ``dtype``, or saturated to its range (``finfo(dtype).min`` as a mask fill, where the
    golden's fp32 minimum would round to -inf)."""
    if not (isinstance(golden, float) and isinstance(target, float) and dtype.is_floating_point):
        return False
    info = torch.finfo(dtype)
    saturated = min(max(golden, info.min), info.max)
    return any(
        torch.tensor(v, dtype=torch.float64).to(dtype).item() == target for v in (golden, saturated)
    )


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
