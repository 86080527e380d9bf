"""A value against its golden, leaf by leaf: validation first, then the comparison."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from .._errors import PrecisionInputError
from ..numerics._assertions import Comparison, ItemComparison, compare, to_tensor
from ..numerics._comparison import _check_pair, resolve_standard
from ..numerics._nested import iter_leaf_pairs
from ._envelope import envelope_standard
from ._records import describe_tensor
from ._tolerances import Tolerance

ToleranceFor = Callable[[torch.dtype], Tolerance]


def validate(value: Any, name: str, test_id: str, tolerance_for: ToleranceFor) -> None:
    """An uncomparable value or an unusable tolerance is the test's error, never a golden
    difference: checked before the golden is read, so an update never rewrites for it."""
    for path, leaf, _ in iter_leaf_pairs(value, value):
        label = f"{name}{path}"
        tensor = to_tensor(leaf, label)
        tolerance = tolerance_for(tensor.dtype)
        try:
            _check_pair(tensor, tensor, "value")
            resolve_standard(
                tolerance.standard, tensor.dtype, rtol=tolerance.rtol, atol=tolerance.atol
            )
        except PrecisionInputError as exc:
            raise PrecisionInputError(f"{test_id}: golden {label}: {exc}") from None


def compare_leaves(
    value: Any,
    expected: Any,
    name: str,
    tolerance_for: ToleranceFor,
    *,
    envelope: Mapping[str, Any] | None,
    references: Mapping[str, torch.Tensor],
    same_dtype: bool,
) -> Comparison:
    """Compare leaf by leaf: the tolerance may depend on each leaf's dtype. With the value
    and tolerance validated, a :class:`PrecisionInputError` here is a golden difference
    (structure, shape, dtype; ``same_dtype``: stored goldens must keep the value's dtype)."""
    items = []
    for path, a_leaf, e_leaf in iter_leaf_pairs(value, expected):
        label = f"{name}{path}"
        a = to_tensor(a_leaf, label)
        e = to_tensor(e_leaf, f"{label} (golden)")
        if same_dtype and (a.dtype != e.dtype or a.shape != e.shape):
            raise PrecisionInputError(
                f"{label}: value is {describe_tensor(a)}, golden is {describe_tensor(e)}"
            )
        tolerance = tolerance_for(a.dtype)
        chosen, reference = None, None
        if not tolerance.is_set:  # no override: the stored envelope, if any
            chosen, reference = envelope_standard(envelope, references, label, e)
        result = compare(
            a,
            e.to(a.device),
            standard=chosen or tolerance.standard,
            rtol=tolerance.rtol,
            atol=tolerance.atol,
            reference=None if reference is None else reference.to(a.device),
            name=label,
        )
        items += [ItemComparison(path, i.comparison, i.details) for i in result.items]
    return Comparison(name, tuple(items))
