"""Helpers shared by the rerun tests: op-level captures of small functions, and calls built
by hand as a dump reader would give them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from pytest_precision import capture, load_dump
from pytest_precision.dump import Dump
from pytest_precision.dump._msprobe import _parse_name
from pytest_precision.dump._records import Call, Record
from pytest_precision.numerics._dtypes import dtype_name


def capture_ops(
    model: torch.nn.Module, path: Path, *inputs: torch.Tensor, **options: Any
) -> tuple[Dump, Any]:
    """Capture ``model(*inputs)`` (op level, tensors, unless ``options`` say otherwise); return
    the dump read back and the model's output."""
    options = {"level": "op", "mode": "tensor", **options}
    with torch.no_grad(), capture(model, path, **options):
        output = model(*inputs)
    return load_dump(path), output


def op_calls(dump: Dump) -> dict[str, Call]:
    """The dump's op calls (no module calls) by name."""
    return {call.name: call for call in dump.calls if call.kind != "Module"}


def make_call(name: str, values: dict[str, Any]) -> Call:
    """A call built by hand, as a reader would give it: tensors are loaded fresh each time."""
    kind, op, _ = _parse_name(name)

    def record(slot: str, value: Any) -> Record:
        if not isinstance(value, torch.Tensor):
            return Record(name=name, slot=slot, kind=kind, op=op, value=value)
        stored = value.clone()
        return Record(
            name=name,
            slot=slot,
            kind=kind,
            op=op,
            dtype=dtype_name(stored.dtype),
            shape=tuple(stored.shape),
            loader=stored.clone,
        )

    records = tuple(record(slot, value) for slot, value in values.items())
    return Call(name, kind, op, None, 0, 0, records)


class Lambda(torch.nn.Module):
    """A module whose forward is the given function, so a capture records its ops."""

    def __init__(self, forward: Callable[..., Any]) -> None:
        super().__init__()
        self.function = forward

    def forward(self, *args: Any) -> Any:
        return self.function(*args)
