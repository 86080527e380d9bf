"""One request cut out of two :func:`capture_vllm` dumps that scheduled it differently.

With prefix caching a request computes only the tokens after its cached prefix; with chunked
prefill its prompt is computed over several steps, beside other requests; in another request
order it sits elsewhere in the flattened batch. Both runs still compute the same thing for the
positions both computed, so the comparison is of those positions: each run's steps are cut into
*segments*, the stretches of positions that lie within one step on both sides, and segment k
becomes step k of two dumps judged by :func:`compare_dumps`, the same judge as two devices.

In a segment, a per-token tensor (``[num_tokens, ...]`` over the step's batch) gives the
segment's rows of the request; a per-request tensor (the logits, ``[num_requests, ...]``, at
each request's last scheduled token) gives the request's row when the segment ends where both
steps end for the request, and is left out otherwise; any other tensor (a weight, a rotary
table) is kept whole. What describes the schedule rather than the request is said, not guessed:
an integer tensor or a non-tensor argument that still differs after the cut (the row that the
logits are taken from, a ``view``'s token count) is taken from the reference (``layout``), and a
float tensor whose shape differs is left out of both sides (``layout`` too). Rank 0's records
only: with tensor parallelism, rank 0's shard.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from itertools import pairwise

import torch

from .._errors import PrecisionInputError
from ..dump._records import Dump, Record
from ..numerics._stats import tensor_stats
from ._vllm import StepBatch


@dataclass(frozen=True)
class Piece:
    """The positions ``start .. start + count - 1`` of a request, computed at ``step``."""

    step: int
    start: int
    count: int

    @property
    def end(self) -> int:
        return self.start + self.count


@dataclass(frozen=True)
class Segment:
    """Positions ``start .. end - 1``, inside one step on each side."""

    start: int
    end: int
    reference: Piece
    variant: Piece

    @property
    def ends_both(self) -> bool:
        """Whether both steps end here for the request (its per-request rows are comparable)."""
        return self.end == self.reference.end == self.variant.end


@dataclass(frozen=True)
class RequestView:
    """The request's segments as the steps of two dumps (``reference``, ``variant``)."""

    reference: Dump
    variant: Dump
    segments: tuple[Segment, ...]
    #: ``name.slot`` of the records that describe the schedule (see the module docstring)
    layout: tuple[str, ...]


def request_pieces(batches: Mapping[int, StepBatch], request: str) -> list[Piece]:
    """Where ``request`` was computed: one :class:`Piece` per step that scheduled it."""
    pieces = []
    for step in sorted(batches):
        batch = batches[step]
        if not any(r == request or r.startswith(f"{request}-") for r in batch.requests):
            continue
        if not batch.starts:
            raise PrecisionInputError(
                f"step {step} of request {request!r} has no token positions: capture it with "
                "this version's capture_vllm (its vllm_batches.json records them)"
            )
        i = batch.index(request)
        pieces.append(Piece(step, batch.starts[i], batch.num_tokens[i]))
    if not pieces:
        raise PrecisionInputError(f"request {request!r} is in no recorded step")
    return pieces


def common_segments(
    reference: Sequence[Piece], variant: Sequence[Piece], upto: int | None = None
) -> list[Segment]:
    """The positions both sides computed (below ``upto``), split where either side's steps
    split them."""
    bounds = sorted(
        {p.start for p in (*reference, *variant)} | {p.end for p in (*reference, *variant)}
    )
    if upto is not None:
        bounds = sorted({b for b in bounds if b < upto} | {upto})
    segments = []
    for start, end in pairwise(bounds):
        ref = next((p for p in reference if p.start <= start and end <= p.end), None)
        var = next((p for p in variant if p.start <= start and end <= p.end), None)
        if ref is not None and var is not None:
            segments.append(Segment(start, end, ref, var))
    return segments


def request_view(
    reference: tuple[Dump, Mapping[int, StepBatch], str],
    variant: tuple[Dump, Mapping[int, StepBatch], str],
    *,
    upto: int | None = None,
) -> RequestView:
    """Cut one request out of two dumps: each side is ``(dump, batches, request id)``;
    positions from ``upto`` on are left out (where the two runs fed different tokens)."""
    (ref_dump, ref_batches, ref_id), (var_dump, var_batches, var_id) = reference, variant
    segments = common_segments(
        request_pieces(ref_batches, ref_id), request_pieces(var_batches, var_id), upto
    )
    if not segments:
        raise PrecisionInputError(f"requests {ref_id!r} and {var_id!r} share no computed token")
    ref_steps, var_steps = _by_step(ref_dump), _by_step(var_dump)
    ref_records: list[Record] = []
    var_records: list[Record] = []
    layout: set[str] = set()
    for k, seg in enumerate(segments):
        ref_cut = _cut_step(
            ref_steps.get(seg.reference.step, []), ref_batches, ref_id, seg, True, k
        )
        var_cut = _cut_step(var_steps.get(seg.variant.step, []), var_batches, var_id, seg, False, k)
        mates = {r.key: r for r in ref_cut}
        schedule = {
            r.key for r in var_cut if r.key in mates and _describes_schedule(r, mates[r.key])
        }
        layout |= schedule
        ref_records += [r for r in ref_cut if not _left_out(r, schedule)]
        var_records += [
            _stand_in(r, mates[r.key]) if r.key in schedule else r
            for r in var_cut
            if not _left_out(r, schedule)
        ]
    return RequestView(
        reference=replace(ref_dump, records=ref_records),
        variant=replace(var_dump, records=var_records),
        segments=tuple(segments),
        layout=tuple(sorted(layout)),
    )


def _by_step(dump: Dump) -> dict[int, list[Record]]:
    steps: dict[int, list[Record]] = {}
    for record in dump.records:
        if record.rank == 0:
            steps.setdefault(record.step, []).append(record)
    return steps


def _cut_step(
    records: list[Record],
    batches: Mapping[int, StepBatch],
    request: str,
    seg: Segment,
    is_reference: bool,
    step: int,
) -> list[Record]:
    piece = seg.reference if is_reference else seg.variant
    batch = batches[piece.step]
    first = batch.token_slice(request).start + seg.start - piece.start
    rows = (first, first + seg.end - seg.start)
    row = batch.index(request)
    cut = []
    for record in records:
        part = _cut_record(record, batch, rows, row if seg.ends_both else None)
        if part is not None:
            cut.append(replace(part, step=step))
    return cut


def _cut_record(
    record: Record, batch: StepBatch, rows: tuple[int, int], row: int | None
) -> Record | None:
    """The request's rows of ``record`` (``rows`` of a per-token tensor; ``row`` of a
    per-request one, None to leave it out); other records whole."""
    shape = record.shape
    if not record.is_tensor or not shape:
        return record
    if shape[0] == batch.total_tokens:
        start, stop = rows
    elif shape[0] == len(batch.requests):
        if row is None:
            return None
        start, stop = row, row + 1
    else:
        return record
    if (start, stop) == (0, shape[0]):
        return record
    new_shape = (stop - start, *shape[1:])
    if record.loader is None:  # no data (uninitialized memory): its shape only
        return replace(record, shape=new_shape, stats=None, stride=None, data_id=None)
    part = _rows(record, start, stop)
    return replace(
        record,
        shape=new_shape,
        stats=tensor_stats(part),
        loader=partial(_rows, record, start, stop),
        stride=None,
        data_id=None,  # the cut is no longer the data other records of that tensor share
    )


def _rows(record: Record, start: int, stop: int) -> torch.Tensor:
    tensor = record.load()
    assert tensor is not None
    return tensor[start:stop].contiguous()


def _describes_schedule(record: Record, mate: Record) -> bool:
    """Whether ``record`` differs from the reference's ``mate`` in what only the schedule
    decides: a non-tensor value, an integer tensor's values, a float tensor's shape."""
    if not record.is_tensor or not mate.is_tensor:
        return record.is_tensor == mate.is_tensor and record.value != mate.value
    if record.shape != mate.shape:
        return True
    if record.dtype is None or not _is_integral(record.dtype) or record.loader is None:
        return False
    mine, theirs = record.load(), mate.load()
    return mine is None or theirs is None or not torch.equal(mine, theirs)


def _is_integral(dtype: str) -> bool:
    return "int" in dtype or "bool" in dtype


def _left_out(record: Record, layout: set[str]) -> bool:
    """A float tensor whose shape follows the schedule: on neither side."""
    return (
        record.key in layout
        and record.is_tensor
        and record.dtype is not None
        and not _is_integral(record.dtype)
    )


def _stand_in(record: Record, mate: Record) -> Record:
    """The reference's record in the variant's place (its name, module and step kept)."""
    return replace(mate, name=record.name, parent=record.parent, step=record.step)
