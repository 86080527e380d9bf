"""How the error grew after the culprit: what left each layer, on the culprit's rank."""

from __future__ import annotations

from ._results import Divergence, ErrorGrowth, LayerError, RecordComparison, layer_of


def error_growth(records: list[RecordComparison], culprit: Divergence, gross: float) -> ErrorGrowth:
    """The error level of each layer's output per decode step, from the culprit's call on: the
    largest over the output slots of the layer's last call in walk order (the model's output
    holds logits and the cache, and the logits are not its last slot); a module outside every
    layer counts as its own layer."""
    start = next((i for i, r in enumerate(records) if r is culprit.record), 0)
    last: dict[tuple[int, str], tuple[str, float]] = {}
    for r in records[start:]:
        if r.rank != culprit.rank or not r.slot.startswith("output") or r.status == "skip":
            continue
        layer = layer_of(r.module) or r.module or "(top level)"
        name, level = last.pop((r.step, layer), ("", 0.0))  # re-inserted: ordered by its end
        level = max(level, r.error_level) if name == r.name else r.error_level
        last[(r.step, layer)] = (r.name, level)
    layers = tuple(
        LayerError(layer, step, name, level) for (step, layer), (name, level) in last.items()
    )
    return ErrorGrowth(layers, gross)
