"""``assert_close``: compare nested values under a standard, and the one failure-message builder.

Structures (tuples, lists, dicts, dataclasses, HF ``ModelOutput``) are walked in parallel; each
leaf pair is compared by :func:`compare_tensors`, and a failure names the path of the item.
"""

from __future__ import annotations

import math
import numbers
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .._errors import PrecisionInputError, PrecisionWarning
from .._text import shown_text
from ._comparison import ShapeMismatch, TensorComparison, compare_tensors
from ._details import HISTOGRAM_EDGES, ErrorDetails, error_details
from ._dtypes import dtype_name
from ._nested import iter_leaf_pairs
from ._standards import VERDICT_ORDER, Standard, Verdict


def _from_numpy(array: np.ndarray, where: str) -> torch.Tensor:
    if array.dtype.name == "bfloat16":  # ml_dtypes: the same bits as torch.bfloat16
        return _from_numpy(array.view(np.int16), where).view(torch.bfloat16)
    if array.dtype.kind not in "biuf" or array.dtype.itemsize > 8:
        raise PrecisionInputError(
            f"{where}: numpy dtype {array.dtype} cannot be compared numerically"
        )
    if not array.dtype.isnative:
        array = array.astype(array.dtype.newbyteorder("="))
    if not array.flags.c_contiguous:  # also covers negative strides, which torch refuses
        array = np.ascontiguousarray(array)
    with warnings.catch_warnings():  # read-only arrays are fine: nothing writes to them
        warnings.filterwarnings("ignore", "The given NumPy array is not writable")
        return torch.from_numpy(array)


def to_tensor(value: Any, where: str = "value") -> torch.Tensor:
    """Turn a tensor, numpy array (ml_dtypes bfloat16 included) or Python number into a tensor."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (np.ndarray, np.generic)):
        return _from_numpy(np.asarray(value), where)
    if isinstance(value, bool):
        return torch.tensor(value)
    if isinstance(value, numbers.Integral):
        if not -(2**63) <= int(value) < 2**63:
            raise PrecisionInputError(f"{where}: integer {value} does not fit in int64")
        return torch.tensor(int(value), dtype=torch.int64)
    if isinstance(value, numbers.Real):
        return torch.tensor(float(value), dtype=torch.float64)
    raise PrecisionInputError(
        f"{where}: cannot compare a value of type {type(value).__name__} "
        "(expected a tensor, numpy array, number, or a tuple/list/dict/dataclass of them)"
    )


@dataclass(frozen=True)
class ItemComparison:
    """One compared leaf: where it sits in the structure, and its comparison."""

    path: str
    comparison: TensorComparison
    details: ErrorDetails | None = None


@dataclass(frozen=True)
class Comparison:
    """Every leaf of a (possibly nested) comparison; the worst verdict wins."""

    name: str | None
    items: tuple[ItemComparison, ...]

    @property
    def verdict(self) -> Verdict:
        return max(
            (item.comparison.verdict for item in self.items),
            key=VERDICT_ORDER.__getitem__,
            default="pass",
        )

    @property
    def passed(self) -> bool:
        return self.verdict != "fail"

    def message(self) -> str:
        """The report of every item that did not pass (empty when all passed)."""
        return "\n\n".join(
            format_report(item, name=self.name)
            for item in self.items
            if item.comparison.verdict != "pass"
        )


def compare(
    actual: Any,
    expected: Any,
    *,
    standard: Standard | str | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    reference: Any = None,
    name: str | None = None,
) -> Comparison:
    """Compare every leaf of two structures; details are computed for the ones that fail."""
    if reference is not None:
        references = {
            p: r
            for p, _, r in iter_leaf_pairs(expected, reference, sides=("expected", "reference"))
        }
    items = []
    for path, a_leaf, e_leaf in iter_leaf_pairs(actual, expected):
        label = _label(name, path)
        a = to_tensor(a_leaf, f"{label} (actual)")
        e = to_tensor(e_leaf, f"{label} (expected)")
        r = to_tensor(references[path], f"{label} (reference)") if reference is not None else None
        try:
            result = compare_tensors(a, e, reference=r, standard=standard, rtol=rtol, atol=atol)
        except PrecisionInputError as exc:
            raise type(exc)(f"{label}: {exc}") from None
        details = None
        if result.verdict != "pass":
            item_rtol, item_atol = result.standard.tolerances(result.dtype)
            greatest = [i for i in (result.max_abs_index, result.max_rel_index) if i is not None]
            details = error_details(
                a,
                e,
                result.standard.rule(result.dtype),
                rtol=item_rtol,
                atol=item_atol,
                indices=greatest,
            )
        items.append(ItemComparison(path, result, details))
    return Comparison(name, tuple(items))


def assert_close(
    actual: Any,
    expected: Any,
    *,
    standard: Standard | str | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    reference: Any = None,
    name: str | None = None,
) -> Comparison:
    """Assert that ``actual`` is close to ``expected`` under a precision standard.

    Works on tensors, numpy arrays, numbers and nested tuples / lists / dicts / dataclasses.
    The default standard depends on the dtype (see :func:`default_standard`); explicit
    ``rtol`` / ``atol`` select allclose. A ``warn`` verdict emits a :class:`PrecisionWarning`.
    Returns the :class:`Comparison` for further inspection.
    """
    __tracebackhide__ = True
    try:
        result = compare(
            actual,
            expected,
            standard=standard,
            rtol=rtol,
            atol=atol,
            reference=reference,
            name=name,
        )
    except ShapeMismatch as exc:
        raise AssertionError(shown_text(str(exc))) from None
    if not result.passed:  # the paths in it may be keys of a golden made elsewhere
        raise AssertionError(shown_text(result.message()))
    if result.verdict == "warn":
        warnings.warn(PrecisionWarning(result.message()), stacklevel=2)
    return result


def _label(name: str | None, path: str) -> str:
    if name and path:
        return f"{name}{path}"
    return name or path or "value"


def _num(x: float) -> str:
    return f"{x:.6g}"


def _element(el: Any) -> str:
    return f"{el.index} (actual {_num(el.actual)}, expected {_num(el.expected)})"


_ULP_AT_ZERO = " (at an expected 0, where one ulp is the smallest subnormal: read atol)"


def format_report(item: ItemComparison, *, name: str | None = None) -> str:
    """The failure (or warning) report of one compared item; at most ~25 lines."""
    c = item.comparison
    d = item.details
    dtypes = dtype_name(c.actual_dtype)
    if c.expected_dtype != c.actual_dtype:
        dtypes += f" vs {dtype_name(c.expected_dtype)}, judged as {dtype_name(c.dtype)}"
    lines = [
        f"{_label(name, item.path)}: {c.verdict.upper()} under the {c.standard.name} standard "
        f"(shape {tuple(c.shape)}, {dtypes})",
        f"  {c.reason}",
        f"  mismatched elements: {c.mismatch_count} / {c.numel} ({100 * c.mismatch_ratio:.3g} %)",
    ]
    if c.max_abs_index is not None and d is not None:
        by_index = {el.index: el for el in d.requested}
        for label, value, index in (
            ("greatest abs error", c.max_abs_err, c.max_abs_index),
            ("greatest rel error", c.max_rel_err, c.max_rel_index),
        ):
            el = by_index.get(index) if index is not None else None
            where = _element(el) if el else f"{index}"
            lines.append(f"  {label}: {_num(value)} at {where}")
    if d is not None and d.scale is not None:
        lines.insert(
            2,
            f"  every element is the expected one times {d.scale:.6g}: a uniform scale "
            "(a wrong constant or scale factor), not rounding",
        )
    at_zero = math.isinf(c.max_rel_err) and math.isfinite(c.max_ulp)
    lines.append(
        f"  cosine {c.cosine:.8f}  rmse {_num(c.rmse)}  sqnr {c.sqnr_db:.4g} dB  "
        f"max ulp {_num(c.max_ulp)}"
        + (
            " (at an expected 0, where one ulp is the smallest subnormal: read atol)"
            if at_zero
            else ""
        )
    )
    lines.append(
        f"  within 1e-3 rel: {100 * c.thousandth_ratio:.4g} %  "
        f"within 5e-3 rel: {100 * c.five_thousandth_ratio:.4g} %"
    )
    if c.actual_nonfinite.total or c.expected_nonfinite.total:
        a, e = c.actual_nonfinite, c.expected_nonfinite
        agree = (
            "agree"
            if c.nonfinite_positions_agree
            else (f"differ at {c.nonfinite_mismatch_count} element(s)")
        )
        lines.append(
            f"  non-finite: actual {a.nan} nan {a.posinf} +inf {a.neginf} -inf; expected "
            f"{e.nan} nan {e.posinf} +inf {e.neginf} -inf; positions {agree}"
        )
    if c.actual_vs_reference is not None and c.expected_vs_reference is not None:
        t, b = c.actual_vs_reference, c.expected_vs_reference
        lines.append(
            f"  vs float64 reference: actual max abs {_num(t.max_abs_err)} rmse {_num(t.rmse)}; "
            f"expected max abs {_num(b.max_abs_err)} rmse {_num(b.rmse)}"
        )
    if d is not None:
        rtol, atol = c.standard.tolerances(c.dtype)
        lines.append(
            f"  would pass elementwise with atol >= {_num(d.required_atol)} (at rtol {rtol:g}) "
            f"or rtol >= {_num(d.required_rtol)} (at atol {atol:g})"
        )
        if d.first_mismatches:
            shown = "; ".join(_element(el) for el in d.first_mismatches)
            lines.append(f"  first mismatches: {shown}")
        lines.append("  worst elements (abs error):")
        lines.extend(
            f"    {el.index}: actual {_num(el.actual)}, expected {_num(el.expected)}, "
            f"abs {_num(el.abs_err)}, rel {_num(el.rel_err)}"
            for el in d.worst
        )
        lines.append("  relative error histogram: " + _histogram(d.histogram))
    return "\n".join(lines)


def _histogram(counts: Sequence[int]) -> str:
    labels = ["0"] + [f"<={edge:g}" for edge in HISTOGRAM_EDGES[1:]] + [f">{HISTOGRAM_EDGES[-1]:g}"]
    return " | ".join(f"{label}: {n}" for label, n in zip(labels, counts, strict=True) if n) or "-"
