"""Logical tensors assembled from the layouts capture recorded (:mod:`._tensor_layouts`).

A layout is recorded where capture learns it: on a DTensor's every record, and on the records of
a tensor-parallel layer's parameters and output. The other records of the same tensor (the op
that read the weight, the op whose output the layer returned) are found here by their data: the
same stored data, or the same shape and statistics (all a statistics-only dump has; a buffer a
kernel filled is recorded again after the call), on the same rank and step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import torch

from .._errors import PrecisionInputError
from ._records import GARBAGE_MEMORY, Record
from ._tensor_layouts import TensorLayout

#: what makes two records of one rank and step the same tensor
_Identity = tuple[object, ...]


def propagate_layouts(records: Sequence[Record]) -> Sequence[Record]:
    """``records``, each record of a tensor some record of which has a layout given that
    layout; the same sequence when no record has one. A buffer passed to a call unwritten
    (no data, no statistics) takes the layout of what the call wrote into a buffer of its shape."""
    known: dict[_Identity, TensorLayout] = {}
    for r in records:
        if r.layout is not None and r.layout.how != "local":  # a call's work, not its tensor
            for identity in _identities(r):
                known.setdefault(identity, r.layout)
    if not known:
        return records
    written: dict[_Identity, TensorLayout] = {}
    for r in records:
        layout = r.layout or next((known[i] for i in _identities(r) if i in known), None)
        if layout is not None and r.slot.startswith("output."):
            written.setdefault((r.rank, r.step, r.name, r.shape, r.dtype), layout)
    out = []
    for r in records:
        if r.layout is None and r.is_tensor:
            layout = next((known[i] for i in _identities(r) if i in known), None)
            if layout is None and r.memory in GARBAGE_MEMORY:
                layout = written.get((r.rank, r.step, r.name, r.shape, r.dtype))
            if layout is not None:
                r = replace(r, layout=layout)
        out.append(r)
    return out


def _identities(r: Record) -> list[_Identity]:
    """Its stored data; its shape and statistics (a buffer a kernel filled is recorded again
    after the call, as a tensor of its own with the same content)."""
    found: list[_Identity] = []
    if r.data_id is not None:
        found.append((r.rank, r.step, r.data_id))
    if r.stats is not None and r.stats.norm != 0:
        found.append((r.rank, r.step, r.shape, r.stats))
    return found


def shard_dim(parts: Sequence[Record]) -> int | None:
    """The dimension along which the parts' recorded ``shard`` layouts place them, when they
    agree on it and on the logical size and together cover the logical tensor; else None."""
    layouts = [p.layout for p in parts]
    first = layouts[0]
    shape = parts[0].shape
    if first is None or first.how != "shard" or shape is None or not shape:
        return None
    dim = first.dim % len(shape) if -len(shape) <= first.dim < len(shape) else None
    if dim is None or any(
        layout is None
        or layout.how != "shard"
        or layout.size != first.size
        or p.shape is None
        or len(p.shape) != len(shape)
        or layout.dim % len(shape) != dim
        for p, layout in zip(parts, layouts, strict=True)
    ):
        return None
    covered = [False] * first.size
    for p, layout in zip(parts, layouts, strict=True):
        assert layout is not None
        assert p.shape is not None
        for piece in layout.pieces:
            if piece.start + piece.size > p.shape[dim]:
                raise PrecisionInputError(
                    f"{p.key} on rank {p.rank}: its layout places elements "
                    f"{piece.start}..{piece.start + piece.size} of a dimension {p.shape[dim]} long"
                )
            covered[piece.logical_start : piece.logical_start + piece.size] = [True] * piece.size
    return dim if all(covered) else None


def is_plain_split(parts: Sequence[Record], dim: int) -> bool:
    """Whether the pieces are the parts' whole tensors, each once, in rank order: what a plain
    concatenation gives (its statistics are those of the parts)."""
    at = 0
    for p in parts:
        assert p.layout is not None
        assert p.shape is not None
        if len(p.layout.pieces) != 1:
            return False
        piece = p.layout.pieces[0]
        if (piece.start, piece.size, piece.logical_start) != (0, p.shape[dim], at):
            return False
        at += piece.size
    return True


def place(
    parts: Sequence[Record],
    tensors: Sequence[torch.Tensor],
    dim: int,
    reference: torch.Tensor | None,
) -> torch.Tensor:
    """The logical tensor the parts' pieces make. Where two ranks hold the same piece (a
    replicated k/v head) and disagree, the one farther from ``reference`` (the golden's
    logical tensor) is kept: a disagreement is evidence, never smoothed over."""
    first = tensors[0]
    assert parts[0].layout is not None
    shape = list(first.shape)
    shape[dim] = parts[0].layout.size
    out = first.new_zeros(shape)
    placed: dict[tuple[int, int], torch.Tensor] = {}
    for p, t in zip(parts, tensors, strict=True):
        assert p.layout is not None
        for piece in p.layout.pieces:
            value = t.narrow(dim, piece.start, piece.size)
            where = (piece.logical_start, piece.size)
            if where in placed and not _replaces(placed[where], value, reference, dim, where):
                continue
            placed[where] = value
            out.narrow(dim, piece.logical_start, piece.size).copy_(value)
    return out


def pick_replica(tensors: Sequence[torch.Tensor], reference: torch.Tensor | None) -> int:
    """Which of replicas (every rank's copy of one tensor) stands for them: the first, or
    where they disagree the one farthest from ``reference``."""
    chosen = 0
    for i in range(1, len(tensors)):
        if _replaces(tensors[chosen], tensors[i], reference, None, None):
            chosen = i
    return chosen


def _replaces(
    kept: torch.Tensor,
    candidate: torch.Tensor,
    reference: torch.Tensor | None,
    dim: int | None,
    where: tuple[int, int] | None,
) -> bool:
    if reference is None or torch.equal(kept, candidate):
        return False
    if dim is not None and where is not None:
        reference = reference.narrow(dim, *where)
    if reference.shape != kept.shape:
        return False
    return _distance(candidate, reference) > _distance(kept, reference)


def _distance(a: torch.Tensor, b: torch.Tensor) -> float:
    diff = (a.to(torch.float64) - b.to(torch.float64)).abs().nan_to_num(nan=float("inf"))
    return float(diff.max()) if diff.numel() else 0.0


def piece_differs(
    part: Record,
    tensor: torch.Tensor,
    golden: torch.Tensor,
    dim: int,
    differs: Callable[[torch.Tensor, torch.Tensor], bool],
) -> bool:
    """Whether any piece of ``part`` differs from the golden's elements where it lands."""
    assert part.layout is not None
    for piece in part.layout.pieces:
        mine = tensor.narrow(dim, piece.start, piece.size)
        if golden.dim() <= dim or piece.logical_start + piece.size > golden.shape[dim]:
            return True  # the golden has no such elements
        want = golden.narrow(dim, piece.logical_start, piece.size)
        if mine.shape != want.shape or differs(mine, want):
            return True
    return False
