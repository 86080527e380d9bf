"""Tensors already recorded during a capture, so that one seen again unchanged is not redone.

The output of one op is the input of the next, and a parameter is an input of every forward: a
tensor seen again reuses the data and statistics of its first record instead of copying and
summarizing it again. A tensor counts as unchanged while it is the same object with the same
version counter value (in-place ops, also through a view, bump it), the same data pointer, dtype,
shape and strides (``.data =`` swaps storage without a bump). Entries hold weak references and
go with their tensor, so nothing is kept alive.

Known blind spots, as for autograd: writes through ``.data`` or from outside torch (a numpy view)
bump no version counter. Inference tensors have no version counter and are never reused.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch

_Geometry = tuple[int, torch.dtype, torch.Size, tuple[int, ...]]


def _geometry(t: torch.Tensor) -> _Geometry | None:
    """Where and how ``t``'s elements lie; ``None`` for tensors without a data pointer."""
    try:
        return t.data_ptr(), t.dtype, t.shape, t.stride()
    except RuntimeError:  # a wrapper subclass without storage
        return None


class RecordedTensors:
    """Record keys of tensors by identity, valid while the tensor is unchanged."""

    def __init__(self, forget: Callable[[str], None]) -> None:
        self._entries: dict[int, tuple[weakref.ref[torch.Tensor], int, _Geometry, str]] = {}
        self._forget = forget  # told of each key that can no longer be returned

    def key_of(self, t: torch.Tensor) -> str | None:
        """The key ``t`` was recorded under, if it is unchanged since; ``None`` otherwise."""
        entry = self._entries.get(id(t))
        if entry is None:
            return None
        ref, version, geometry, key = entry
        if ref() is not t or t._version != version or _geometry(t) != geometry:
            return None
        return key

    def remember(self, t: torch.Tensor, key: str) -> None:
        """Note that ``t``, as it is now, was recorded under ``key``."""
        if t.is_inference():  # no version counter: a later write would go unseen
            return
        geometry = _geometry(t)
        if geometry is None:
            return
        ident = id(t)

        def died(_: Any) -> None:
            entry = self._entries.get(ident)
            if entry is not None and entry[3] == key:
                del self._entries[ident]
                self._forget(key)

        replaced = self._entries.get(ident)
        self._entries[ident] = (weakref.ref(t, died), t._version, geometry, key)
        if replaced is not None:  # the same tensor recorded again, changed
            self._forget(replaced[3])

    def clear(self) -> None:
        """Forget everything, telling no one (the capture is over)."""
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)
