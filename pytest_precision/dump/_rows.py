"""One request's rows cut out of a batched dump, shaped like the dump of the request run alone.

"The same prompt answers differently alone and in a batch" is a comparison of two runs that
compute the same thing for that prompt: the batch only adds rows around it (and padding, when
its neighbours are longer). Cutting the prompt's rows out of every batched record turns the
question into an ordinary dump comparison, judged by the same rules as two devices.

A batched tensor is matched to the alone run's record of the same call and slot, dimension by
dimension: a dimension of the same size is kept; ``batch`` against 1 is the row; ``batch * n``
against ``n`` is a batch folded into another dimension (``(batch * seq, hidden)``); the padded
length against the prompt's length is its positions (the last ones under left padding);
``batch * padded`` against the length is both. What cannot be cut that way is said, not
guessed:

* integer and boolean tensors (positions, masks, index ranges) that differ from the alone
  run's after the cut describe the batch's layout, not the prompt's values: the alone run's
  record stands in for them, and ``layout`` names them. A float mask is data and is cut.
* non-tensor arguments that differ (a ``view``'s batch size) are the batch's shapes: the
  alone run's value stands in, and rerunning a call from the cut inputs stays possible.
* float tensors that mix rows (an MoE block's tokens gathered per expert) have no row of the
  prompt: the module that holds such a call is judged as a whole (its own inputs and outputs
  cut), and the calls inside it are left out on both sides (``opaque``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from enum import Enum, auto
from functools import partial
from typing import Literal

import torch

from .._errors import PrecisionInputError
from ..numerics._stats import tensor_stats
from ._records import Dump, Record

PaddingSide = Literal["left", "right"]


@dataclass(frozen=True)
class RowLayout:
    """Where one request sits in a batch: ``row`` of ``batch`` rows, its ``length`` tokens
    inside a padded length of ``padded``, padded on ``padding_side``."""

    batch: int
    row: int
    length: int
    padded: int
    padding_side: PaddingSide = "left"

    def __post_init__(self) -> None:
        if not 0 <= self.row < self.batch:
            raise PrecisionInputError(f"row {self.row} is not a row of a batch of {self.batch}")
        if not 0 < self.length <= self.padded:
            raise PrecisionInputError(
                f"a request of {self.length} tokens does not fit a padded length of {self.padded}"
            )

    @property
    def start(self) -> int:
        """The request's first position in the padded sequence."""
        return self.padded - self.length if self.padding_side == "left" else 0

    def cut(self, t: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor | None:
        """The part of batched ``t`` that belongs to the request, with the alone run's
        ``shape``; None when no dimension rule explains the two shapes."""
        if tuple(t.shape) == shape:
            return t
        if t.dim() != len(shape):
            return None
        rows_found = False  # one dimension holds the batch; the ones after it only positions
        for dim, (size, alone) in enumerate(zip(t.shape, shape, strict=True)):
            if size == alone:
                continue
            if not rows_found and size == self.batch and alone == 1:
                t, rows_found = t.narrow(dim, self.row, 1), True
            elif not rows_found and size == self.batch * alone:
                t, rows_found = t.unflatten(dim, (self.batch, alone)).select(dim, self.row), True
            elif not rows_found and size == self.batch * self.padded and alone == self.length:
                t = t.unflatten(dim, (self.batch, self.padded)).select(dim, self.row)
                t, rows_found = t.narrow(dim, self.start, self.length), True
            elif size == self.padded and alone == self.length:
                t = t.narrow(dim, self.start, self.length)
            else:
                return None
        return t


@dataclass(frozen=True)
class RowView:
    """The two sides of a batch-invariance comparison: the request alone (``alone``) and its
    rows of the batch (``batched``), with the calls of ``opaque`` modules left out of both."""

    alone: Dump
    batched: Dump
    #: ``name.slot`` of the integer / boolean tensors and arguments that describe the batch's
    #: layout, taken from the alone run
    layout: tuple[str, ...]
    #: modules whose calls mix rows, judged as a whole
    opaque: tuple[str, ...]


def row_view(alone: Dump, batched: Dump, layout: RowLayout) -> RowView:
    """Cut the request's rows out of ``batched`` (see the module docstring)."""
    _require_data(batched)
    _require_data(alone)
    by_key = {(r.step, r.rank, r.key): r for r in alone.records}
    records: list[Record] = []
    layout_keys: list[str] = []
    mixing: set[str] = set()  # calls with a float tensor that has no row of the request
    for record in batched.records:
        mate = by_key.get((record.step, record.rank, record.key))
        if mate is None or not record.is_tensor or not mate.is_tensor:
            if mate is not None and not record.is_tensor and record.value != mate.value:
                layout_keys.append(record.key)
                record = replace(record, value=mate.value)
            records.append(record)
            continue
        if record.loader is None or mate.loader is None:  # uninitialized memory: never compared
            records.append(replace(mate, name=record.name, parent=record.parent))
            continue
        cut = _cut_record(record, mate, layout)
        if cut is None:
            layout_keys.append(record.key)
            cut = replace(mate, name=record.name, parent=record.parent)
        elif cut is _Cut.MIXES_ROWS:
            mixing.add(record.name)
            cut = record
        records.append(cut)
    opaque = sorted({r.module or "" for r in batched.records if r.name in mixing})
    left_out = (
        mixing | _calls_inside(batched.records, opaque) | _calls_inside(alone.records, opaque)
    )
    return RowView(
        alone=replace(alone, records=[r for r in alone.records if r.name not in left_out]),
        batched=replace(batched, records=[r for r in records if r.name not in left_out]),
        layout=tuple(layout_keys),
        opaque=tuple(m for m in opaque if m),
    )


def _require_data(dump: Dump) -> None:
    if any(r.is_tensor and r.loader is None and r.memory is None for r in dump.records):
        raise PrecisionInputError(
            f"{dump.path}: a batch-invariance comparison cuts rows out of tensors; this dump "
            "holds statistics only (capture it with mode='tensor')"
        )


class _Cut(Enum):
    #: what :func:`_cut_record` answers for a float tensor that has no row of the request
    MIXES_ROWS = auto()


def _cut_record(
    record: Record, mate: Record, layout: RowLayout
) -> Record | Literal[_Cut.MIXES_ROWS] | None:
    """The request's part of ``record``; None when the alone run's ``mate`` must stand in (a
    layout tensor); ``MIXES_ROWS`` for a float tensor that has no row of the request."""
    tensor = record.load()
    assert mate.shape is not None
    assert tensor is not None
    part = layout.cut(tensor, mate.shape)
    if not (tensor.is_floating_point() or tensor.is_complex()):
        expected = mate.load()
        if part is None or expected is None or not torch.equal(part, expected):
            return None
    elif part is None:
        return _Cut.MIXES_ROWS
    return replace(
        record,
        shape=tuple(part.shape),
        stats=tensor_stats(part),
        loader=partial(_part, record, layout, mate.shape),
        stride=None,
        data_id=None,  # the cut is no longer the data other records of that tensor share
    )


def _part(record: Record, layout: RowLayout, shape: tuple[int, ...]) -> torch.Tensor:
    tensor = record.load()
    assert tensor is not None
    part = layout.cut(tensor, shape)
    assert part is not None
    return part.contiguous()


def _calls_inside(records: Iterable[Record], modules: Iterable[str]) -> set[str]:
    """The calls other than module calls that ran inside one of ``modules`` (or at the root,
    for the empty path, where only the mixing calls themselves are left out)."""
    paths = tuple(m for m in modules if m)
    if not paths:
        return set()
    return {
        r.name
        for r in records
        if r.kind != "Module"
        and r.module is not None
        and any(r.module == p or r.module.startswith(p + ".") for p in paths)
    }
