"""Where a rank's tensor sits in the logical tensor of the whole model: the layout capture
records next to a tensor that a parallel layer split between ranks.

A shape alone cannot say it for a fused projection: rank ``r`` of a q/k/v projection holds its
q heads, then its k heads, then its v heads, side by side, and the logical tensor holds all q
heads, then all k heads, then all v heads. A :class:`TensorLayout` lists the runs (*pieces*) of
the rank's tensor along one dimension and where each run lands in the logical tensor; runs
two ranks both hold (a k/v head replicated because there are fewer of them than ranks) land
on the same place; rows of the rank's tensor in no piece (a vocabulary's padding) are not part
of the logical tensor. In a dump, a record's optional ``layout`` member (docs/dump-format.md).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

import torch

from .._errors import DumpFormatError

How = Literal["shard", "replicated", "partial", "local"]


@dataclass(frozen=True)
class Piece:
    """``size`` elements from ``start`` along the layout's dimension of the rank's tensor,
    which are the elements from ``logical_start`` of the logical tensor."""

    start: int
    size: int
    logical_start: int


@dataclass(frozen=True)
class TensorLayout:
    """How one rank's tensor relates to the logical one: ``replicated`` (every rank holds it
    whole), ``partial`` (the ranks' tensors add up to it), ``shard``: the ``pieces`` along
    ``dim`` (negative: from the last) of a logical tensor ``size`` long there, or ``local``: no
    part of any logical tensor (a lookup's indices masked to this rank's range of a vocabulary,
    and what they fetch)."""

    how: How
    dim: int = 0
    size: int = 0
    pieces: tuple[Piece, ...] = ()

    def to_json(self) -> dict[str, Any]:
        if self.how != "shard":
            return {"how": self.how}
        pieces = [[p.start, p.size, p.logical_start] for p in self.pieces]
        return {"how": "shard", "dim": self.dim, "size": self.size, "pieces": pieces}


REPLICATED = TensorLayout("replicated")
PARTIAL = TensorLayout("partial")
LOCAL = TensorLayout("local")


def shard(dim: int, size: int, pieces: list[tuple[int, int, int]]) -> TensorLayout:
    """A ``shard`` layout from ``(start, size, logical_start)`` runs."""
    return TensorLayout("shard", dim, size, tuple(Piece(*p) for p in pieces))


def parse_layout(value: object, where: str) -> TensorLayout | None:
    """A record's ``layout`` member, checked (a dump is untrusted input)."""
    if value is None:
        return None
    if not isinstance(value, dict) or value.get("how") not in (
        "shard",
        "replicated",
        "partial",
        "local",
    ):
        raise DumpFormatError(where, f"malformed layout {value!r}")
    if value["how"] != "shard":
        return TensorLayout(value["how"])
    dim, size, pieces = value.get("dim"), value.get("size"), value.get("pieces")
    if type(dim) is not int or type(size) is not int or size < 0 or not isinstance(pieces, list):
        raise DumpFormatError(where, f"malformed layout {value!r}")
    parsed = []
    for piece in pieces:
        if (
            not isinstance(piece, list)
            or len(piece) != 3
            or not all(type(n) is int and n >= 0 for n in piece)
            or piece[2] + piece[1] > size
        ):
            raise DumpFormatError(where, f"malformed layout piece {piece!r} (logical size {size})")
        parsed.append(Piece(*piece))
    return TensorLayout("shard", dim, size, tuple(parsed))


def with_layout(
    t: torch.Tensor, members: str, layout: TensorLayout | None
) -> tuple[torch.Tensor, str]:
    """The tensor to record (a DTensor's local one) and its record's members with its
    ``layout`` (a DTensor's own, from its placements) added."""
    if (local := dtensor_local(t)) is not None:
        t, layout = local[0], local[1] or layout
    if layout is not None:
        encoded = json.dumps(layout.to_json(), separators=(",", ":"))
        members = f'{members},"layout":{encoded}'
    return t, members


def dtensor_local(t: torch.Tensor) -> tuple[torch.Tensor, TensorLayout | None] | None:
    """A ``torch.distributed.tensor.DTensor``'s local tensor and its layout, from its
    placements (``Shard(dim)``, ``Replicate()``, ``Partial()``) on a one-dimensional mesh;
    None for any other tensor. A mesh of more dimensions, or a tensor split along two, gets no
    layout (the merge then goes by shapes)."""
    if type(t) is torch.Tensor or type(t) is torch.nn.Parameter:
        return None  # the common case, without a failed attribute look-up
    placements = getattr(t, "placements", None)
    mesh = getattr(t, "device_mesh", None)
    if placements is None or mesh is None or not hasattr(t, "to_local"):
        return None
    local: torch.Tensor = t.to_local()
    if len(placements) != 1 or mesh.ndim != 1:
        return local, None
    placement = placements[0]
    if placement.is_replicate():
        return local, REPLICATED
    if placement.is_partial():
        return local, PARTIAL
    dim = placement.dim % t.dim()
    size = t.shape[dim]
    # torch.chunk's split: every rank but the last ones holds ceil(size / ranks)
    full = -(-size // mesh.size())
    start = min(mesh.get_local_rank() * full, size)
    return local, shard(dim, size, [(0, local.shape[dim], start)])
