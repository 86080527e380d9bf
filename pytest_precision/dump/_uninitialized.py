"""Memory whose bytes mean nothing from run to run, recorded without data (dtype and shape only)
so that a comparison does not blame the op that holds it:

* what an ``empty`` op allocated and nothing has written since (whatever the allocator left);
* opaque handles: 0-dim integer tensors handed to a custom kernel (vLLM's ``_C.onednn_mm`` gets
  the address of its packed oneDNN weights), which differ between processes.

vLLM's kernels work this way: ``out = torch.empty(...)``, then ``torch.ops._C.onednn_mm(out, ...)``
fills it. A storage counts as written once a custom op's schema writes it, an ``out=`` argument
receives it, or an in-place Tensor method (``copy_``, ``fill_``, ``__setitem__``) runs on it.
Memory the allocator hands out again counts as written as soon as an op returns a tensor in it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

#: Calls (``kind.op``) that return uninitialized memory.
EMPTY_APIS = frozenset(
    {"Torch.empty", "Torch.empty_like", "Torch.empty_strided", "Tensor.new_empty",
     "Tensor.new_empty_strided", "Aten.empty.memory_format", "Aten.empty_like"}
)  # fmt: skip


def _storage(t: torch.Tensor) -> int | None:
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):  # a wrapper subclass without storage
        return None


def _tensors(values: Iterable[Any]) -> Iterable[torch.Tensor]:
    for value in values:
        if isinstance(value, torch.Tensor):
            yield value
        elif isinstance(value, (tuple, list)):
            yield from (v for v in value if isinstance(v, torch.Tensor))


class UninitializedMemory:
    """Storages (by data pointer) allocated by an ``empty`` op and not written since."""

    def __init__(self) -> None:
        self._storages: set[int] = set()

    def written(self, values: Iterable[Any]) -> None:
        if self._storages:
            self._storages.difference_update(_storage(t) for t in _tensors(values))

    def after_call(
        self, api: str, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any
    ) -> None:
        """Note what a call allocated or wrote: an ``empty`` op's output; the ``out=`` argument,
        ``self`` of an in-place method; any fresh output (memory the allocator handed out again
        now holds data; a view shares an input's storage and is not fresh)."""
        if api in EMPTY_APIS:
            self._storages.update(p for t in _tensors([output]) if (p := _storage(t)) is not None)
            return
        if not self._storages:
            return
        if "out" in kwargs:
            self.written([kwargs["out"]])
        kind, _, op = api.partition(".")
        if args and kind == "Tensor" and (op == "__setitem__" or op.endswith("_")):
            self.written(args[:1])
        inputs = {_storage(t) for t in _tensors([*args, *kwargs.values()])}
        self._storages.difference_update(
            p for t in _tensors([output]) if (p := _storage(t)) not in inputs
        )

    def handles(self, args: tuple[Any, ...]) -> None:
        """Note the 0-dim integer tensors among a custom op's arguments (opaque handles)."""
        for t in _tensors(args):
            if t.dim() == 0 and not t.is_floating_point() and (p := _storage(t)) is not None:
                self._storages.add(p)

    def holds(self, t: torch.Tensor) -> bool:
        """Whether ``t`` lies in memory allocated by an ``empty`` op and not written since."""
        return bool(self._storages) and _storage(t) in self._storages

    def clear(self) -> None:
        self._storages.clear()
