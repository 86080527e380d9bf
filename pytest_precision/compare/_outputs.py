"""Is a call whose output fails guilty, or did it only pass on the error it received?

A float64 rerun from the target's own recorded inputs tells. Without one, an output beyond
rounding convicts a call whose inputs match exactly, and drifting inputs convict (weakly) a
call that amplified their error. A module is held to reordered rounding instead: it holds many
roundings, and an equivalent rewrite (a fused kernel) changes them.
"""

from __future__ import annotations

import torch

from ..dump._records import Call
from ..numerics._comparison import TensorComparison
from ..numerics._dtypes import dtype_from_name
from ._measurements import Measurements
from ._precision import RunPrecision
from ._provenance import Provenance
from ._results import (
    Cause,
    Divergence,
    RecordComparison,
    Rule,
    StatsComparison,
    evidence,
    layer_of,
)

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


#: The dtype's gross-error limit: what leaves a layer this far off is no longer the golden's
#: output in any precision (ten times reordered rounding).
GROSS = {dtype: 10 * level for dtype, level in REORDERED_ROUNDING.items()}


class OutputJudge:
    """The rerun, rounding and amplification rules: whether what a call produced differs by
    more than rounding. Notes the calls it could not check (``unverified``)."""

    def __init__(
        self, precision: RunPrecision, provenance: Provenance, measurements: Measurements
    ) -> None:
        self.precision = precision
        self.provenance = provenance
        #: reruns and rounding checks, measured on demand or beforehand
        self.measurements = measurements
        self.unverified: list[str] = []

    def judge(
        self,
        golden: Call,
        target: Call,
        inputs: list[RecordComparison],
        failing: list[RecordComparison],
        received: float = 0.0,
    ) -> Divergence | None:
        """An output fails: guilty if the call added error of its own. A rerun in float64 from
        the target's own recorded inputs tells; without one, exactly matching inputs convict
        an output beyond rounding, and drifting inputs convict (weakly) only if the call
        amplified their error (an index output, a discrete choice, never shows amplification).
        ``received``: the error other ranks fed into a collective."""
        worst = max(failing, key=lambda r: r.error_level)
        before = max(self.provenance.input_level(target, inputs), received)
        why_not = (
            self.measurements.refusal(target)
            if target.kind != "Module"
            else "a module is not rerun"
        )
        if why_not is None:
            found, cleared = self.judge_rerun(golden, target, failing)
            if found is None and cleared and before == 0.0:
                self.provenance.note_noise(target, inputs, failing)
            elif found is None and not cleared:
                self.unverified.append(target.name)
            return found
        if before == 0.0:
            found = self.judge_clean_inputs(golden, target, failing)
            if found is None:
                self.provenance.note_noise(target, inputs, failing)
            return found
        # an index (topk's, argmax's) is a discrete choice: drifting inputs flip its near ties
        # whatever the size of the drift, so only what the call computes measures amplification
        amplified = [r for r in failing if _computed(r)]
        worst = max(amplified, key=lambda r: r.error_level, default=worst)
        after = worst.error_level if amplified else 0.0
        if after > AMPLIFICATION * before:
            reason = (
                f"its inputs differ slightly (error level {before:.3g}), {worst.slot} much more "
                f"({after:.3g}); it cannot be rerun to check ({why_not}): {worst.reason}"
            )
            return divergence(target, golden, "amplification", reason, worst)
        self.unverified.append(target.name)
        return None

    def judge_clean_inputs(
        self, golden: Call, target: Call, failing: list[RecordComparison]
    ) -> Divergence | None:
        """The culprit if a call that cannot be rerun and received exactly the golden's inputs
        put out more than rounding. A module holds many roundings: one rounding's envelope
        would convict a fused kernel inside it, so a module must differ by more than
        reordered rounding. An output the runs do not put out alike (another shape) is the
        other code's, when another output is alike (:func:`evidence`)."""
        passing = {r.slot for r in target.outputs} - {r.slot for r in failing}
        beyond = [
            r
            for r in evidence(failing, alike_elsewhere=bool(passing))
            if (
                self.code_difference(r)
                if target.kind == "Module"
                else self.beyond_rounding(golden, target, r)
            )
        ]
        if not beyond:
            return None
        worst = max(beyond, key=lambda r: r.error_level)
        reason = f"its inputs match the golden exactly, {worst.slot} does not: {worst.reason}"
        return divergence(target, golden, "output", reason, worst)

    def judge_rerun(
        self, golden: Call, target: Call, failing: list[RecordComparison]
    ) -> tuple[Divergence | None, bool]:
        """The culprit if a failing output lands outside its dtype's rounding envelope of the
        rerun; and whether every failing output could be checked at all. An overflow of the
        output's dtype convicts too: it is where the model leaves the dtype's range."""
        checked = True
        for r in failing:
            own = self.measurements.rerun_check(target, r.slot)
            if own.refused:
                return None, False
            if own.verdict is None:
                checked = False
            elif own.verdict == "fail":
                reason = (
                    f"{r.slot} differs from a rerun of the call from its own recorded "
                    f"inputs beyond {own.dtype} rounding: {own.reason}"
                )
                return divergence(target, golden, "rerun", reason, r), checked
        return None, checked

    def beyond_rounding(self, golden: Call, target: Call, r: RecordComparison) -> bool:
        """A failing record whose difference is more than rounding: outside the rounding
        envelope of the golden value (a statistics record has nothing finer than failing)."""
        if not r.failed:
            return False
        if not isinstance(r.metrics, TensorComparison) or self._slipped(r):
            return True
        g = next((x for x in golden.records if x.slot == r.slot), None)
        t = next((x for x in target.records if x.slot == r.slot), None)
        return self.measurements.beyond_rounding(g, t, r.metrics.dtype)

    def code_difference(self, r: RecordComparison) -> bool:
        """A failing output that differs by more than reordered rounding (see
        :func:`code_difference`)."""
        return code_difference(r, self.precision)

    def gross_limit(self, r: RecordComparison) -> float:
        """The gross-error limit of the dtype ``r`` is judged in."""
        return GROSS.get(judged_in(r, self.precision), GROSS[torch.float32])

    def _slipped(self, r: RecordComparison) -> bool:
        """A floating dtype the run's precision does not explain (bf16 in an fp32 run)."""
        if r.golden_dtype is None or r.target_dtype is None:
            return False
        golden, target = dtype_from_name(r.golden_dtype), dtype_from_name(r.target_dtype)
        floating = golden.is_floating_point and target.is_floating_point
        return floating and not self.precision.expects(golden, target)


def _computed(r: RecordComparison) -> bool:
    """A floating (or complex) output: a value computed, not an index chosen."""
    dtype = dtype_from_name(r.target_dtype or r.golden_dtype or "float32")
    return dtype.is_floating_point or dtype.is_complex


def code_difference(r: RecordComparison, precision: RunPrecision) -> bool:
    """A failing output that differs by more than reordered rounding (relative RMS error;
    the largest statistic's difference without data). Equivalent rewrites (a fused kernel,
    another op order) stay far below it."""
    if not r.failed:
        return False
    if not isinstance(r.metrics, (TensorComparison, StatsComparison)):
        return True
    level = (
        r.metrics.largest_difference if isinstance(r.metrics, StatsComparison) else r.error_level
    )
    limit = REORDERED_ROUNDING.get(judged_in(r, precision), REORDERED_ROUNDING[torch.float32])
    return level > limit


def judged_in(r: RecordComparison, precision: RunPrecision) -> torch.dtype:
    """The dtype a record pair is judged in: the lower precision of the two."""
    golden = dtype_from_name(r.golden_dtype or r.target_dtype or "float32")
    target = dtype_from_name(r.target_dtype or r.golden_dtype or "float32")
    return precision.judging_dtype(golden, target)


def divergence(
    target: Call,
    golden: Call,
    cause: Cause,
    reason: str,
    record: RecordComparison,
    rule: Rule | None = None,
) -> Divergence:
    """The target's call as the culprit, for ``cause``, by ``rule`` (by default the rule that
    gives that cause)."""
    if rule is None:
        module = target.kind == "Module" and cause == "output"
        rule = "module with clean inputs" if module else _RULES[cause]
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
        rule=rule,
    )


_RULES: dict[Cause, Rule] = {
    "source": "source",
    "wiring": "wiring",
    "unmatched": "code only one run has",
    "output": "clean inputs",
    "rerun": "float64 rerun",
    "amplification": "amplification",
    "stomp": "stomp",
}
