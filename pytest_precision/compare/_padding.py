"""Positions the attention mask excludes are not evidence, in a dump comparison.

Each dump says where its forwards were padded (``dump/_padding``: the root's attention mask).
Where both dumps padded a forward alike, every record of it whose layout holds pad positions
is marked with that padding: its tensor is compared at its real positions only (the pair, the
float64 rerun of its call, the rounding check), and a statistics dump's record is judged by
its statistics over the real positions. Dumps without that information, or padded otherwise
(a prompt alone against its padded row), are compared whole, as before.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import torch

from ..dump._padding import Padding
from ..dump._records import PARAMETER_SLOTS, Call, Dump, Record
from ._results import PaddingLeftOut, RecordComparison


def paddings(dump: Dump) -> dict[tuple[int, int], Padding]:
    """The padding of each (rank, step) the dump records one for."""
    return {(r.rank, r.step): r.padding for r in dump.records if r.padding is not None}


def exclude_padding(golden: Dump, target: Dump) -> tuple[Dump, Dump, PaddingLeftOut | None]:
    """Both dumps with the records of the forwards they padded alike marked (see the module
    docstring), and what was left out; the dumps unchanged where none was."""
    golden_paddings, target_paddings = paddings(golden), paddings(target)
    shared = {
        key: padding
        for key, padding in golden_paddings.items()
        if target_paddings.get(key) == padding
    }
    if not shared:
        return golden, target, None
    worst = max(shared.values(), key=lambda p: p.left_out(p.length))
    left_out = PaddingLeftOut(*worst.left_out(worst.length))
    return _marked(golden, shared), _marked(target, shared), left_out


def _marked(dump: Dump, shared: dict[tuple[int, int], Padding]) -> Dump:
    return replace(dump, records=[_mark(r, shared.get((r.rank, r.step))) for r in dump.records])


def _mark(record: Record, padding: Padding | None) -> Record:
    if (
        padding is None
        or record.shape is None
        or record.slot.partition(".")[0] in PARAMETER_SLOTS
        or padding.keep(record.shape, every_position=True) is None
    ):
        return record
    stats = record.stats if record.real_stats is None else record.real_stats
    return replace(record, padding=padding, stats=stats)


def real_pair(
    golden: Record, golden_tensor: torch.Tensor, target: Record, target_tensor: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The two tensors of a record pair at their real positions, when both records are marked
    alike; unchanged otherwise."""
    keep = real_positions(target)
    if keep is None or golden.padding != target.padding:
        return golden_tensor, target_tensor
    golden_real, target_real = keep(golden_tensor), keep(target_tensor)
    if golden_real is None or target_real is None:
        return golden_tensor, target_tensor
    return golden_real, target_real


def real_positions(record: Record) -> Callable[[torch.Tensor], torch.Tensor | None] | None:
    """What keeps the real positions of a tensor shaped like ``record``'s (None: it is
    compared whole)."""
    padding = record.padding
    return None if padding is None else padding.real_part


def uncut_outputs(
    target: Call, rows: list[RecordComparison], rerunnable: Callable[[], bool]
) -> list[RecordComparison]:
    """``rows`` with the failing outputs of a call that received pad positions and put them
    out where they cannot be cut (an MoE dispatch sorting tokens by expert, a sum over the
    positions) skipped: what differs there may be the pad positions' values, which are not
    evidence. The module around the call is judged by its own outputs, cut. A call that can
    be rerun keeps them: the rerun reads its own inputs whole, pad positions included, and
    tells whether it computed right (``rerunnable`` is asked only when it matters)."""
    if not any(r.padding is not None for r in target.inputs):
        return rows
    uncut = {r.slot for r in target.outputs if r.is_tensor and r.padding is None}
    if not any(r.failed and r.slot in uncut for r in rows) or rerunnable():
        return rows
    reason = "holds pad positions mixed with real ones (not evidence)"
    return [
        replace(r, status="skip", reason=f"{reason}; {r.reason}")
        if r.failed and r.slot in uncut
        else r
        for r in rows
    ]
