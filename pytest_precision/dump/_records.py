"""The in-memory model every dump reader produces: records in execution order, loaded lazily."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import torch

from ..numerics._stats import TensorStats
from ._padding import Padding
from ._tensor_layouts import TensorLayout


@dataclass(frozen=True)
class RecordRef:
    """Another record of the same dump and rank: its call name, slot and decode step."""

    name: str
    slot: str
    step: int


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
    #: where the data is stored, shared by the records of one stored tensor (a weight recorded
    #: as a module parameter and as an op input): the same id means the same data
    data_id: str | None = None
    #: the strides the tensor had when recorded, when it was not contiguous (data is stored
    #: contiguous; replay restores the layout, which can change an op's last bits)
    stride: tuple[int, ...] | None = None
    #: why a tensor has no data: its memory was ``"unwritten"`` or ``"partly written"`` since an
    #: ``empty`` op allocated it (its bytes are whatever the allocator left, not data); or
    #: ``"filled"``: its data was assembled by writes into slices of such a buffer, so no call
    #: put it out whole
    memory: str | None = None
    #: the earlier record this tensor was expected to equal (the same tensor, its version
    #: counter unmoved) when capture found its content changed: memory written outside any
    #: recorded call (a stomp); ``None`` otherwise and in dumps that do not tell
    changed_since: RecordRef | None = None
    #: where this rank's tensor sits in the logical tensor of all ranks, when capture knew it
    #: (a DTensor's placements, a tensor-parallel layer's split); ``None`` otherwise
    layout: TensorLayout | None = None
    #: the attention mask of the forward this record belongs to, where its layout holds pad
    #: positions (set by a comparison, see ``_padding``); on the root's ``attention_mask``
    #: record, as the dump stores it
    padding: Padding | None = None
    #: a statistics dump's statistics over the real positions of a padded tensor
    real_stats: TensorStats | None = None

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


#: The ``memory`` a tensor recorded without data may have (see ``Record.memory``).
MEMORY_STATES = frozenset({"unwritten", "partly written", "filled"})
#: The ``memory`` of a tensor recorded without data.
GARBAGE_MEMORY = frozenset({"unwritten", "partly written"})

#: Slot prefixes of the values a call received (recorded before it ran) and produced.
INPUT_SLOTS = ("input", "kwargs")
OUTPUT_SLOTS = ("output",)
PARAMETER_SLOTS = ("parameters",)


#: Collective communication ops, by name. ``gather``, ``scatter``, ``reduce`` and ``broadcast``
#: are collectives only as ``Distributed`` calls: ``Tensor.gather`` and ``Tensor.scatter_`` are
#: everyday ops.
# fmt: off
COLLECTIVES = frozenset({
    "all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "reduce_scatter",
    "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "send", "recv", "isend",
    "irecv", "barrier", "allgather_base", "reduce_scatter_base",
})
# fmt: on


@dataclass(frozen=True, eq=False)
class Call:
    """One recorded call (an op, or a module's forward) with its records in recording order."""

    name: str
    kind: str
    op: str
    module: str | None
    rank: int
    step: int
    records: tuple[Record, ...]

    @property
    def inputs(self) -> tuple[Record, ...]:
        """Positional and keyword arguments (``input.*``, ``kwargs.*``), as they were passed."""
        return self._slots(INPUT_SLOTS)

    @property
    def outputs(self) -> tuple[Record, ...]:
        return self._slots(OUTPUT_SLOTS)

    @property
    def parameters(self) -> tuple[Record, ...]:
        """A module's own parameters (``parameters.*``); ops have none."""
        return self._slots(PARAMETER_SLOTS)

    @property
    def collective(self) -> bool:
        """A communication op (what it puts out comes from other ranks too): a
        ``Distributed`` call, or an op named like one (``Torch.all_reduce`` in older native
        dumps, vLLM's ``Custom.vllm.all_reduce``)."""
        if self.kind == "Distributed":
            return True
        if self.kind == "Module":
            return False
        parts = self.op.split(".")
        name = parts[1] if self.kind == "Custom" and len(parts) > 1 else parts[0]
        return name.strip("_") in COLLECTIVES

    def _slots(self, prefixes: tuple[str, ...]) -> tuple[Record, ...]:
        return tuple(r for r in self.records if r.slot.partition(".")[0] in prefixes)


def group_calls(records: Iterable[Record]) -> list[Call]:
    """Records grouped into calls, ordered by where each call's first record is.

    A module's records are not contiguous (its inputs come before the ops inside it, its
    outputs after them), so calls are keyed by rank, step and name, not by adjacency.
    """
    grouped: dict[tuple[int, int, str], list[Record]] = {}
    for record in records:
        grouped.setdefault((record.rank, record.step, record.name), []).append(record)
    return [
        Call(name, first.kind, first.op, first.module, rank, step, tuple(members))
        for (rank, step, name), members in grouped.items()
        for first in (members[0],)
    ]


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

    @cached_property
    def calls(self) -> list[Call]:
        """The records grouped by call (see :func:`group_calls`)."""
        return group_calls(self.records)
