"""Positions the attention mask excludes are not evidence: which entries of a tensor are padding.

In a left- or right-padded batch the values a model computes at pad positions are never used
(every real position attends to them through zero weights) and are not defined by the model:
a fully masked softmax row is uniform in an eager attention, something else in SDPA, and
follows each dtype's mask constant. Two correct runs disagree there by whole units, so a
comparison that reads them convicts an honest implementation, and the statistics of a tensor
move with its pad positions' extremes.

Capture reads the model's 2-D ``attention_mask`` (0 at pad positions) from the arguments of
each top-level forward and writes it into the dump (:class:`Padding`, on the root's mask
record); a statistics dump also holds each padded tensor's statistics over its real positions.
A comparison then leaves the pad entries out of every tensor whose layout says where its
positions are (:meth:`Padding.real_part`), and judges the rest. Dim 0 is the batch and the
position the first later dim of the forward's length (its ``input_ids``) or of the mask's (a
KV cache holding every position):

* ``(batch, seq, ...)``: hidden states, a linear's output, logits;
* ``(batch, heads, seq, ...)``, ``(batch, heads, 1, seq, ...)``: queries, keys and values,
  attention scores and the 4-D mask by query row;
* ``(batch * seq, ...)``: tokens flattened for a router or an MoE dispatch.

Other tensors (weights, a tensor whose sizes match no rule) are compared whole, and a call
that received pad entries and puts them out where they cannot be cut (tokens sorted by
expert) is judged by the module around it. A bug that lets pad positions leak into real ones
(an attention that ignores the mask) still shows: the mask's entries pairing a real query
with a pad key are kept, and real positions move.

A statistic mixes all of a tensor's entries, and without the data no op is rerun: the
judge weighs an op's output statistics against its inputs'. A score pairing a real query
with a pad key carries that key's values, so statistics over the real positions leave out
every dim of a position's length (``every_position``): keys as well as queries. A mask that
lets pads in then shows at the softmax, whose real rows move.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import torch


@dataclass(frozen=True)
class Padding:
    """The attention mask of one forward: ``real[b][p]`` is False at a pad position; ``query``
    is how many of the last positions the forward computes (its ``input_ids`` length)."""

    real: tuple[tuple[bool, ...], ...]
    query: int

    @property
    def batch(self) -> int:
        return len(self.real)

    @property
    def length(self) -> int:
        return len(self.real[0])

    def mask(self, positions: int) -> torch.Tensor:
        """The ``(batch, positions)`` boolean mask of the last ``positions`` (True: real)."""
        return _as_tensor(self.real)[:, self.length - positions :]

    def keep(self, shape: tuple[int, ...], *, every_position: bool = False) -> torch.Tensor | None:
        """A boolean tensor that broadcasts to ``shape``, True at the entries of real
        positions; None when ``shape``'s layout holds no pad position. Dim 0 is the batch and
        the position is the first later dim of the forward's length or the mask's (a query's,
        a cached key's); ``every_position``: every such dim is one (the key dim of attention
        scores too). Or dim 0 is batch * positions (the tokens flattened). Not to be written
        to: it is shared by the records of one shape."""
        return _keep(self, shape, every_position)

    def _keep(self, shape: tuple[int, ...], every_position: bool) -> torch.Tensor | None:
        if not shape:
            return None
        trailing = [1] * (len(shape) - 1)
        lengths = tuple(dict.fromkeys((self.query, self.length)))
        for positions in lengths:
            if self.batch > 1 and shape[0] == self.batch * positions and self._pads(positions):
                return self.mask(positions).reshape(-1, *trailing)
        if len(shape) < 2 or shape[0] != self.batch:
            return None
        keep: torch.Tensor | None = None
        for dim, size in enumerate(shape[1:], start=1):
            if size not in lengths:
                continue
            if self._pads(size):
                view = [self.batch, *trailing]
                view[dim] = size
                real = self.mask(size).reshape(view)
                keep = real if keep is None else keep & real
            if not every_position:
                break
        return keep

    def _pads(self, positions: int) -> bool:
        return not bool(self.mask(positions).all())

    def real_part(self, t: torch.Tensor, *, every_position: bool = False) -> torch.Tensor | None:
        """The entries of ``t`` at real positions (see :meth:`keep`), flattened; None when
        ``t``'s layout holds no pad position (compare it whole)."""
        keep = self.keep(tuple(t.shape), every_position=every_position)
        if keep is None:
            return None
        return t[keep.to(t.device).expand(t.shape)]

    def left_out(self, positions: int) -> tuple[int, int]:
        """``(pad positions, positions)`` of the last ``positions``."""
        mask = self.mask(positions)
        return int((~mask).sum()), mask.numel()

    def to_json(self) -> dict[str, Any]:
        return {"real": [[int(v) for v in row] for row in self.real], "query": self.query}

    @classmethod
    def from_json(cls, data: object) -> Padding:
        """The ``padding`` field of a record; ValueError when it is malformed."""
        if not isinstance(data, dict):
            raise ValueError(f"malformed padding {data!r}")
        real, query = data.get("real"), data.get("query")
        if (
            not isinstance(real, list)
            or not real
            or not all(isinstance(row, list) and row and len(row) == len(real[0]) for row in real)
            or not all(v in (0, 1) and type(v) is int for row in real for v in row)
            or type(query) is not int
            or not 0 < query <= len(real[0])
        ):
            raise ValueError(f"malformed padding {data!r}")
        return cls(tuple(tuple(bool(v) for v in row) for row in real), query)


@lru_cache(maxsize=256)
def _keep(padding: Padding, shape: tuple[int, ...], every_position: bool) -> torch.Tensor | None:
    """:meth:`Padding.keep`, once per shape: a dump's records repeat a few shapes."""
    return padding._keep(shape, every_position)


@lru_cache(maxsize=16)
def _as_tensor(real: tuple[tuple[bool, ...], ...]) -> torch.Tensor:
    return torch.tensor(real, dtype=torch.bool)


def padding_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Padding | None:
    """The padding of a top-level forward: its 2-D 0/1 ``attention_mask`` keyword with at least
    one pad position, the forward's length read from ``input_ids`` (or ``inputs_embeds``, or
    the first tensor argument); None without a mask or without padding."""
    mask = kwargs.get("attention_mask")
    if not isinstance(mask, torch.Tensor) or mask.dim() != 2 or mask.is_floating_point():
        return None
    mask = mask.detach().cpu()
    if bool(mask.all()) or not bool(((mask == 0) | (mask == 1)).all()):
        return None
    ids = kwargs.get("input_ids")
    if ids is None:
        ids = kwargs.get("inputs_embeds")
    if ids is None:
        ids = next((a for a in args if isinstance(a, torch.Tensor)), None)
    if not isinstance(ids, torch.Tensor) or ids.dim() < 2 or ids.shape[0] != mask.shape[0]:
        return None
    query = int(ids.shape[1])
    if not 0 < query <= mask.shape[1]:
        return None
    real = tuple(tuple(bool(v) for v in row) for row in mask.to(torch.bool).tolist())
    return Padding(real, query)
