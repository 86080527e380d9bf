"""A weight of a lower-precision run is the golden's weight rounded once, nothing else.

In a bf16 run compared with its fp32 golden, the standard's bf16 tolerance holds every record,
weights included: one wrong element among thousands moves a weight's statistics less than it.
But a weight is no computation's result, only the checkpoint's values cast once, and that
is far tighter (:mod:`..numerics._cast_stats`): its max and min exactly the cast of the golden's,
its mean and norm within what one rounding per element can move them.

A weight here is a module's parameter, or an op's input that is one; in a dump without module
records, the argument an op's API names its weight or bias (``F.linear``'s second and third),
when no recorded call produced it and it is no view or slice of a recorded output. Any other
input from nowhere may be an activation that calls the dump left out computed in the run's
dtype: no cast of the golden's.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from ..dump._records import Call, Record
from ..numerics._cast_stats import not_one_cast
from ..numerics._dtypes import dtype_from_name
from ._derivation import is_floating
from ._one_rounding import bare_op
from ._provenance import Provenance
from ._results import RecordComparison, StatsComparison, is_input

#: The slots of the arguments an op's API names its weight and bias (positional or keyword).
# fmt: off
WEIGHT_ARGUMENTS: dict[str, tuple[str, ...]] = {
    "linear": ("input.1", "input.2", "kwargs.weight", "kwargs.bias"),
    "embedding": ("input.1", "kwargs.weight"),
    "layer_norm": ("input.2", "input.3", "kwargs.weight", "kwargs.bias"),
    "rms_norm": ("input.2", "kwargs.weight"),
    "group_norm": ("input.2", "input.3", "kwargs.weight", "kwargs.bias"),
    **{
        conv: ("input.1", "input.2", "kwargs.weight", "kwargs.bias")
        for conv in ("conv1d", "conv2d", "conv3d")
    },
}
# fmt: on
#: The ops and module classes whose weight is a matrix of distinct values.
MATRIX_OPS = frozenset({"linear", "embedding", "conv1d", "conv2d", "conv3d"})
MATRIX_MODULES = frozenset({"Linear", "Embedding", "Conv1d", "Conv2d", "Conv3d"})


def judge_weight_casts(
    golden: Call,
    target: Call,
    compared: list[RecordComparison],
    provenance: Provenance,
    *,
    stats_in_float64: bool,
) -> list[RecordComparison]:
    """``compared`` with each weight that passed failed when its statistics are no narrowing
    cast of the golden's. ``stats_in_float64``: both dumps computed statistics in float64
    (native dumps; msprobe reduces in the tensor's own dtype)."""
    if not any(_passed_stats(r) for r in compared):
        return compared
    golden_records = {r.slot: r for r in golden.records}
    target_records = {r.slot: r for r in target.records}
    out = []
    for r in compared:
        g, t = golden_records.get(r.slot), target_records.get(r.slot)
        if _passed_stats(r) and g is not None and t is not None and _is_weight(t, provenance):
            reason = _not_a_cast(g, t, stats_in_float64, distinct=_is_matrix(t, target))
            if reason is not None:
                what = f"a weight of {t.dtype} that is no rounding of the golden's {g.dtype}"
                r = replace(r, status="fail", reason=f"{what}: {reason} ({r.reason})")
        out.append(r)
    return out


def _passed_stats(r: RecordComparison) -> bool:
    return r.status in ("pass", "warn") and isinstance(r.metrics, StatsComparison)


def _is_weight(record: Record, provenance: Provenance) -> bool:
    if not (record.is_tensor and is_floating(record)):
        return False
    if record.slot.startswith("parameters"):
        return True
    if not is_input(record.slot):
        return False
    if provenance.parameter_name(record.rank, record) is not None:
        return True
    # a dump without module records: a weight argument from nowhere, no view of an output
    return (
        record.slot in WEIGHT_ARGUMENTS.get(bare_op(record.op), ())
        and provenance.op_level
        and not provenance.producers(record.rank, record)
        and provenance.unmatched_producer(record.rank, record) is None
        and provenance.recorded.derivation(record, 0.0) is None
    )


def _is_matrix(record: Record, call: Call) -> bool:
    """The weight matrix of a contraction (``linear``, ``embedding``, ``conv``): drawn or
    trained values, all distinct, whose rounding errors are independent. Other parameters
    may repeat a few values (a norm's ones, Mamba's ``A_log``)."""
    if record.slot.startswith("parameters"):
        return (
            call.kind == "Module"
            and call.op in MATRIX_MODULES
            and record.slot == "parameters.weight"
        )
    return bare_op(call.op) in MATRIX_OPS and record.slot in ("input.1", "kwargs.weight")


def _not_a_cast(
    golden: Record, target: Record, stats_in_float64: bool, *, distinct: bool
) -> str | None:
    if golden.stats is None or target.stats is None:
        return None
    g_dtype, t_dtype = dtype_from_name(golden.dtype), dtype_from_name(target.dtype)
    return not_one_cast(
        golden.stats,
        target.stats,
        g_dtype,
        t_dtype,
        golden_stats_dtype=torch.float64 if stats_in_float64 else g_dtype,
        target_stats_dtype=torch.float64 if stats_in_float64 else t_dtype,
        distinct=distinct,
    )
