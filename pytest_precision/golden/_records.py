"""What a golden comparison leaves in reports: small JSON-ready summaries of its items."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ..numerics._assertions import Comparison, ItemComparison
from ..numerics._comparison import TensorComparison
from ..numerics._dtypes import dtype_name
from ..numerics._envelopes import envelope_excess
from ..numerics._nested import iter_leaf_pairs
from ..numerics._standards import VERDICT_ORDER


def badness(c: TensorComparison) -> tuple[int, float, float]:
    return (VERDICT_ORDER[c.verdict], c.mismatch_ratio, c.max_rel_err)


#: What a record keeps of each compared item: enough to rank and to explain, kept small since
#: records also travel as JUnit properties.
_ITEM_FIELDS = (
    "verdict",
    "reason",
    "standard",
    "dtype",
    "shape",
    "cosine",
    "max_abs_err",
    "max_rel_err",
    "mean_abs_err",
    "rmse",
    "sqnr_db",
    "max_ulp",
    "thousandth_ratio",
    "five_thousandth_ratio",
    "mismatch_count",
    "numel",
)


def item_summary(item: ItemComparison) -> dict[str, Any]:
    summary = item.comparison.to_dict()
    return {"path": item.path, **{key: summary[key] for key in _ITEM_FIELDS}}


def describe_tensor(t: torch.Tensor) -> str:
    return f"{dtype_name(t.dtype)} of shape {tuple(t.shape)}"


def device_of(value: Any) -> torch.device | None:
    for _, leaf, _ in iter_leaf_pairs(value, value):
        if isinstance(leaf, torch.Tensor):
            return leaf.device
    return None


def comparison_excess(comparison: Comparison) -> float | None:
    """The worst item's distance to its envelope's limit (1.0 = on it)."""
    values = [
        envelope_excess(
            c.standard,
            c,
            None
            if c.actual_vs_reference is None or c.expected_vs_reference is None
            else (c.actual_vs_reference, c.expected_vs_reference),
        )
        for c in (item.comparison for item in comparison.items)
    ]
    known = [v for v in values if v is not None]
    return max(known) if known else None


def golden_record(
    test_id: str,
    name: str,
    where: str,
    status: str,
    *,
    comparison: Comparison | None = None,
    message: str = "",
    envelope: tuple[Mapping[str, Any] | None, float | None] = (None, None),
) -> dict[str, Any]:
    """The JSON record of one golden check: status, envelope, verdict and its items."""
    record: dict[str, Any] = {
        "test": test_id,
        "name": name,
        "golden": where,
        "status": status,
        "message": message,
    }
    stored, excess = envelope
    if stored is not None or excess is not None:
        record["envelope"] = {
            "kind": None if stored is None else stored.get("kind"),
            "order": None if stored is None else stored.get("order"),
            "excess": excess,
        }
    if comparison is not None and comparison.items:
        worst = max(comparison.items, key=lambda item: badness(item.comparison))
        record["verdict"] = comparison.verdict
        record["standard"] = worst.comparison.standard.name
        record["worst"] = item_summary(worst)
        record["items"] = [item_summary(item) for item in comparison.items]
    return record
