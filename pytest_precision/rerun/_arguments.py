"""A recorded call's arguments rebuilt from the dump: tensors loaded in their recorded layout,
non-tensor values decoded, in the order the call received them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..dump._records import Call, Record
from ._ops import NotReplayable

#: Values recorded as strings that torch wants back as objects (``"torch.float32"``): torch's
#: dtypes, memory formats and layouts only, read from its namespace without a lookup the dump
#: could steer to anything else (a recorded "torch.save" stays a string, never a callable).
_TORCH_OBJECTS = {
    f"torch.{name}": value
    for name, value in vars(torch).items()
    if isinstance(value, (torch.dtype, torch.memory_format, torch.layout))
}


class _Leaf:
    """One recorded value in the slot tree (a dict could be a container of slots)."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


def _decoded(value: Any) -> Any:
    """A recorded JSON value as torch expects it: dtype strings back to ``torch.dtype`` etc."""
    if isinstance(value, str):
        return _TORCH_OBJECTS.get(value, value)
    if isinstance(value, list):
        return [_decoded(item) for item in value]
    if isinstance(value, dict):
        return {key: _decoded(item) for key, item in value.items()}
    return value


def _argument(
    call: Call, record: Record, convert: Callable[[torch.Tensor], torch.Tensor] | None
) -> Any:
    if not record.is_tensor:
        return _decoded(record.value)
    tensor = record.load()
    if tensor is None:
        shape = "" if record.shape is None else f" {list(record.shape)}"
        raise NotReplayable(
            f"{call.name}: {record.slot} ({record.dtype}{shape}) has no tensor data: the dump "
            "holds statistics only (replay needs a dump of tensors: capture mode='tensor', "
            "msprobe task 'tensor')"
        )
    if record.stride is not None:
        tensor = _in_recorded_order(tensor, record.stride)
    return tensor if convert is None else convert(tensor)


def _in_recorded_order(tensor: torch.Tensor, stride: tuple[int, ...]) -> torch.Tensor:
    """The (contiguous) recorded data laid out like the recorded tensor: dimensions in the
    recorded memory order (a transposed operand is transposed again) and broadcast dimensions
    (stride 0) expanded again, as kernels choose their path by layout."""
    base = tensor
    for dim, (size, step) in enumerate(zip(tensor.shape, stride, strict=True)):
        if step == 0 and size > 1:  # every slice along it is the same: keep one
            base = base.narrow(dim, 0, 1)
    order = sorted(range(tensor.dim()), key=lambda d: -stride[d])
    inverse = sorted(range(tensor.dim()), key=order.__getitem__)
    return base.permute(order).contiguous().permute(inverse).expand(tensor.shape)


def _slot_tree(
    call: Call, convert: Callable[[torch.Tensor], torch.Tensor] | None
) -> dict[str, Any]:
    """``{"input": {"0": leaf, "1": {"0": leaf, ...}}, "kwargs": {...}}`` from dotted slots."""
    tree: dict[str, Any] = {}
    for record in call.inputs:
        *path, last = record.slot.split(".")
        if not path:
            raise NotReplayable(f"{call.name}: slot {record.slot} names no argument")
        node = tree
        for key in path:
            node = node.setdefault(key, {})
            if not isinstance(node, dict):
                raise NotReplayable(f"{call.name}: slot {record.slot} nests inside a value")
        if last in node:
            raise NotReplayable(f"{call.name}: slot {record.slot} is recorded twice")
        node[last] = _Leaf(_argument(call, record, convert))
    return tree


def _build(call: Call, node: Any, where: str) -> Any:
    """A container back from its slots: numbered items -> tuple, named items -> dict."""
    if isinstance(node, _Leaf):
        return node.value
    if not all(key.isdigit() for key in node):
        return {key: _build(call, item, f"{where}.{key}") for key, item in node.items()}
    return tuple(_build(call, item, f"{where}.{i}") for i, item in _numbered(call, node, where))


def _numbered(call: Call, node: dict[str, Any], where: str) -> list[tuple[int, Any]]:
    if not all(key.isdigit() for key in node):
        raise NotReplayable(f"{call.name}: {where}.* slots are not numbered: {sorted(node)}")
    items = sorted((int(key), item) for key, item in node.items())
    missing = sorted(set(range(len(items))) - {i for i, _ in items})
    if missing:
        raise NotReplayable(
            f"{call.name}: incomplete arguments: {where}.{missing[0]} is not in the dump"
        )
    return items


def rebuild_arguments(
    call: Call, *, convert: Callable[[torch.Tensor], torch.Tensor] | None = None
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """args and kwargs as the op received them, from the call's ``input.*`` / ``kwargs.*``
    records: tensors loaded (through ``convert``), nested slots rebuilt (numbered -> tuple, named
    -> dict), recorded values decoded (dtype strings -> ``torch.dtype``). Raises NotReplayable
    when a tensor has no data (statistics-only dump) or slots are missing."""
    tree = _slot_tree(call, convert)
    positional = _numbered(call, tree.get("input", {}), "input")
    args = tuple(_build(call, item, f"input.{i}") for i, item in positional)
    kwargs = {
        key: _build(call, item, f"kwargs.{key}") for key, item in tree.get("kwargs", {}).items()
    }
    if call.kind == "Tensor" and call.op in ("__getitem__", "__setitem__") and len(args) > 1:
        # A tuple index (x[..., :8]) is recorded as a JSON list; as a list it would mean
        # advanced indexing for plain ints, so the recorded form is taken as the usual tuple.
        index = args[1]
        if isinstance(index, list):
            args = (args[0], tuple(index), *args[2:])
    return args, kwargs
