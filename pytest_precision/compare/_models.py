"""Are the two dumps of the same model? Their modules' parameters, by name and shape, say.

Compared call by call, a dump of another model (another architecture, another hidden size)
convicts its first weight as a source, which sends the user hunting a loading bug. The
parameters the module records hold (``parameters.*``: names and shapes, no tensor read) tell
before any call is judged: when more than a small fraction of them is on one side only or of
another shape, the comparison says that the dumps are of different models, and judges nothing.
A few parameters of another shape are left to the walk: a bug (a stray bias, a weight of the
wrong size) convicts its module there.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from ..dump._records import Call
from ._provenance import join
from ._results import ModelMismatch, ParameterDifference

#: The share of parameters that may differ in name or shape between dumps of one model; a
#: model of another size or architecture differs in far more (a Llama against a Qwen2 with
#: q/k/v biases: a quarter; another MLP width: three in eight per layer).
SAME_MODEL_SHARE = 0.1


def model_mismatch(golden: Iterable[Call], target: Iterable[Call]) -> ModelMismatch | None:
    """The parameters that differ in name or shape, when more than ``SAME_MODEL_SHARE`` of
    them (and more than one) do; None when the dumps hold the same model, or when either
    dump records no parameters (an op-level dump: nothing to tell)."""
    golden_shapes, target_shapes = _parameter_shapes(golden), _parameter_shapes(target)
    ranks = {rank for rank, _ in golden_shapes} & {rank for rank, _ in target_shapes}
    golden_shapes = {k: v for k, v in golden_shapes.items() if k[0] in ranks}
    target_shapes = {k: v for k, v in target_shapes.items() if k[0] in ranks}
    names = sorted(golden_shapes.keys() | target_shapes.keys())
    if not golden_shapes or not target_shapes:
        return None
    differing = [
        ParameterDifference(
            name, rank, golden_shapes.get((rank, name)), target_shapes.get((rank, name))
        )
        for rank, name in names
        if _differs(golden_shapes.get((rank, name)), target_shapes.get((rank, name)))
    ]
    if len(differing) <= max(1, SAME_MODEL_SHARE * len(names)):
        return None
    return ModelMismatch(tuple(differing), len(names))


def _parameter_shapes(calls: Iterable[Call]) -> dict[tuple[int, str], tuple[int, ...]]:
    """Each module parameter's shape, by (rank, full name), from the first call of its module."""
    out: dict[tuple[int, str], tuple[int, ...]] = {}
    for call in calls:
        if call.kind != "Module":
            continue
        for record in call.parameters:
            name = join(call.module, record.slot.removeprefix("parameters."))
            out.setdefault((call.rank, name), record.shape or ())
    return out


def _differs(golden: tuple[int, ...] | None, target: tuple[int, ...] | None) -> bool:
    """On one side only, or of another shape; an empty parameter (bf16 weights that vLLM on
    CPU packed into oneDNN) has a shape that says nothing of the model."""
    if golden is None or target is None:
        return True
    if 0 in (math.prod(golden), math.prod(target)):
        return False
    return golden != target
