"""The statistics of a padded tensor over its real positions (``real_stats``, see ``_padding``),
made once per tensor and forward however many records share it."""

from __future__ import annotations

import torch

from ._native import stats_json
from ._padding import Padding
from ._writer import host_stats


class RealStats:
    """The ``real_stats`` members of one forward's records, by the data they share.

    A tensor seen again (an op's output read by three consumers) is one record's data with
    several records; its statistics over the real positions are the same for each record of
    the same shape (the shape decides where the positions are), so they are read once."""

    def __init__(self) -> None:
        self._padding: Padding | None = None
        self._known: dict[tuple[str, tuple[int, ...]], str] = {}

    def members(self, padding: Padding, t: torch.Tensor, data_key: str) -> str:
        """``,"real_stats":...`` for a record of ``t`` whose data is ``data_key``'s, or ``""``
        when ``t``'s layout holds no pad position."""
        if padding is not self._padding:  # a new forward: its tensors are new
            self._padding = padding
            self._known.clear()
        known = self._known.get((data_key, tuple(t.shape)))
        if known is None:
            real = padding.real_part(t.detach(), every_position=True)
            real_stats = None if real is None else host_stats(real)
            known = "" if real_stats is None else f',"real_stats":{stats_json(real_stats)}'
            self._known[data_key, tuple(t.shape)] = known
        return known
