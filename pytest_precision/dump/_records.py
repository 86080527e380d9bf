"""The in-memory model every dump reader produces: records in execution order, loaded lazily."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .._metrics import TensorStats


@dataclass(frozen=True, eq=False)
class Record:
    """One captured value: a tensor (or JSON value) in one slot of one call.

    ``name`` identifies the call (``Functional.linear.3.forward``,
    ``Module.model.layers.0.mlp.Linear.forward.0``); ``slot`` the value inside it
    (``input.0``, ``kwargs.attention_mask``, ``output.0``, ``parameters.weight``).
    """

    name: str
    slot: str
    kind: str
    op: str
    module: str | None = None
    parent: str | None = None
    dtype: str | None = None
    shape: tuple[int, ...] | None = None
    stats: TensorStats | None = None
    value: Any = None
    rank: int = 0
    step: int = 0
    loader: Callable[[], torch.Tensor] | None = field(default=None, repr=False)
    #: content checksum recorded by the dumper (msprobe's md5 task stores a CRC32 hex string)
    checksum: str | None = None

    @property
    def key(self) -> str:
        """``name.slot``: unique within one rank and step."""
        return f"{self.name}.{self.slot}"

    @property
    def is_tensor(self) -> bool:
        return self.dtype is not None

    def load(self) -> torch.Tensor | None:
        """The recorded tensor, read from disk now; ``None`` in a statistics-only dump."""
        return None if self.loader is None else self.loader()


@dataclass
class Dump:
    """A loaded dump: its records in execution order (rank by rank, step by step)."""

    path: Path
    format: str
    records: Sequence[Record]
    environment: dict[str, Any] = field(default_factory=dict)

    def __iter__(self) -> Iterator[Record]:
        return iter(self.records)

    def __len__(self) -> int:
        return len(self.records)
