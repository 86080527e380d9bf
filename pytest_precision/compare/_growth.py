"""How the error grew after the culprit: what left each layer, on the culprit's rank."""

from __future__ import annotations

from ._results import Divergence, ErrorGrowth, LayerError, RecordComparison, layer_of


def error_growth(records: list[RecordComparison], culprit: Divergence, gross: float) -> ErrorGrowth:
    """The error level of each layer's output (its last output record, in walk order) from
    the culprit's call on; a module outside every layer counts as its own layer."""
    start = next((i for i, r in enumerate(records) if r is culprit.record), 0)
    last: dict[tuple[int, str], RecordComparison] = {}
    for r in records[start:]:
        if r.rank != culprit.rank or not r.slot.startswith("output") or r.status == "skip":
            continue
        layer = layer_of(r.module) or r.module or "(top level)"
        last.pop((r.step, layer), None)  # re-inserted: ordered by where each layer ends
        last[(r.step, layer)] = r
    layers = tuple(
        LayerError(layer, step, r.name, r.error_level) for (step, layer), r in last.items()
    )
    return ErrorGrowth(layers, gross)
