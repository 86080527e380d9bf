"""An op with clean inputs carries one rounding: the statistics judgement of single-op bugs.

Without tensor data an op cannot be rerun, and the standard's statistics tolerance (fp32:
``1e-4``) is sized for drift a whole layer accumulates. An op whose tensor inputs match the
golden's exactly (every statistic bitwise equal) may move its output's statistics only by what
another correct implementation's rounding can (:mod:`..numerics._stats_rounding`): a changed
formula (tanh-approximated GELU, a softmax computed in fp16) is beyond it, another summation
order (a matmul on 1 or 2 threads) is within it. The rule does not depend on the dump's
format: msprobe's Max / Min / Mean / Norm are judged alike, with their own rounding.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

import torch

from ..dump._records import Call, Record
from ..numerics._dtypes import dtype_from_name
from ..numerics._stats import TensorStats
from ..numerics._stats_rounding import one_rounding
from ..rerun._recompute import is_contraction
from ._results import RecordComparison, StatsComparison, is_input

#: Ops that compute each output element from the elements at the same place (no sum): one
#: rounding of the result each. Any other op may sum, and its terms' rounding is allowed for.
# fmt: off
ELEMENTWISE = frozenset({
    "add", "sub", "mul", "div", "truediv", "radd", "rsub", "rmul", "rtruediv", "neg", "abs",
    "pow", "rpow", "square", "sqrt", "rsqrt", "reciprocal", "exp", "exp2", "expm1", "log",
    "log2", "log1p", "sin", "cos", "tan", "tanh", "sigmoid", "erf", "erfc", "gelu", "silu",
    "relu", "relu6", "leaky_relu", "elu", "selu", "celu", "mish", "softplus", "hardswish",
    "hardsigmoid", "hardtanh", "logsigmoid", "clamp", "clip", "where", "masked_fill", "lerp",
    "addcmul", "addcdiv", "float", "half", "bfloat16", "double", "to", "type", "type_as",
})
# fmt: on

#: Ops whose output is drawn at random: two correct runs differ by design.
# fmt: off
RANDOM = frozenset({
    "dropout", "rand", "randn", "randint", "rand_like", "randn_like", "bernoulli",
    "multinomial", "normal", "uniform", "exponential",
})
# fmt: on


def judge_one_rounding(
    golden: Call,
    target: Call,
    rows: list[RecordComparison],
    *,
    stats_in_float64: bool,
) -> list[RecordComparison]:
    """``rows`` with the statistics of each output that passed the standard failed when the
    op's tensor inputs match exactly and the output moved beyond one rounding of its dtype.
    ``stats_in_float64``: both dumps computed their statistics in float64 (native dumps; msprobe
    sums in the tensor's own dtype)."""
    op = bare_op(target.op)
    if target.kind == "Module" or target.collective or op in RANDOM:
        return rows
    received = [r for r in rows if is_input(r.slot) and _is_tensor_row(r)]
    if not all(_exact(r) for r in received):
        return rows
    golden_records = {r.slot: r for r in golden.records}
    target_records = {r.slot: r for r in target.records}
    inputs = [target_records[r.slot] for r in received if r.slot in target_records]
    out = []
    for r in rows:
        g, t = golden_records.get(r.slot), target_records.get(r.slot)
        if (
            r.slot.startswith("output")
            and r.status in ("pass", "warn")
            and isinstance(r.metrics, StatsComparison)
            and g is not None
            and t is not None
            and g.stats is not None
            and t.stats is not None
            and g.dtype == t.dtype
        ):
            r = _judged(r, g.stats, t.stats, t, op, target, inputs, stats_in_float64)
        out.append(r)
    return out


def _judged(
    r: RecordComparison,
    golden: TensorStats,
    target: TensorStats,
    record: Record,
    op: str,
    call: Call,
    inputs: Sequence[Record],
    stats_in_float64: bool,
) -> RecordComparison:
    dtype = dtype_from_name(record.dtype)
    if not dtype.is_floating_point:
        return r
    terms, terms_norm = _terms(op, call, record, inputs)
    stats_dtype = torch.float64 if stats_in_float64 else dtype
    allowed = one_rounding(
        golden, target, dtype, terms=terms, terms_norm=terms_norm, stats_dtype=stats_dtype
    )
    beyond = allowed.beyond(golden, target)
    if beyond is None:
        return r
    name, moved, allowance = beyond
    what = f"{terms} terms each" if terms > 1 else "elementwise"
    reason = (
        f"clean inputs, output statistics beyond one rounding: {name} moved {moved:.2g} "
        f"relative, one rounding of {record.dtype} allows {allowance:.2g} ({what}); {r.reason}"
    )
    return replace(r, status="fail", reason=reason)


def _terms(op: str, call: Call, output: Record, inputs: Sequence[Record]) -> tuple[int, float]:
    """How many values each output element sums (1 for an elementwise op), and for a
    contraction a bound on the norm of its terms' magnitudes (``||S|| <= ||x|| * ||w||`` for
    a product, ``sqrt(k) * ||x||`` for a sum of ``k``). Unknown ops count as reductions over
    their longest axis or their input-to-output size ratio, whichever is larger."""
    floating = [
        r
        for r in inputs
        if r.shape is not None
        and r.stats is not None
        and dtype_from_name(r.dtype).is_floating_point
    ]
    if op in ELEMENTWISE or not floating:
        return 1, 0.0
    n = max(math.prod(output.shape or ()), 1)
    sizes = [math.prod(r.shape or ()) for r in floating]
    ratio = max(sizes) // n
    terms = max([ratio, *(max(r.shape or (1,)) for r in floating)])
    if not is_contraction(call):
        return terms, 0.0
    by_norm = sorted(floating, key=lambda r: r.stats.norm if r.stats else 0.0, reverse=True)
    norms = [r.stats.norm if r.stats else 0.0 for r in by_norm]
    if len(norms) == 1:
        scale = math.sqrt(max(ratio, 1))
        return terms, norms[0] * (scale / max(ratio, 1) if op == "mean" else scale)
    # a product of the two largest; each further input (a bias) adds once per output row
    rest = sum(
        norm * math.sqrt(n / max(math.prod(r.shape or ()), 1))
        for r, norm in zip(by_norm[2:], norms[2:], strict=True)
    )
    return terms, norms[0] * norms[1] + rest


def _is_tensor_row(r: RecordComparison) -> bool:
    return r.golden_dtype is not None or r.target_dtype is not None


def _exact(r: RecordComparison) -> bool:
    """The golden's input exactly: every statistic equal (or every element, with data)."""
    if r.status not in ("pass", "warn"):
        return False
    if isinstance(r.metrics, StatsComparison):
        return r.metrics.largest_difference == 0.0
    return r.metrics is not None and r.error_level == 0.0


def bare_op(op: str) -> str:
    """``__rmul__`` and ``mul_`` are ``rmul`` and ``mul``; a namespaced op keeps its last
    part."""
    return op.rpartition(".")[2].strip("_")
