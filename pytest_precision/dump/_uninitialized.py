"""Memory whose bytes mean nothing from run to run, recorded without data (dtype and shape only,
and ``"memory"`` saying why) so that a comparison does not blame the op that holds it:

* what an ``empty`` op allocated and nothing has written since (whatever the allocator left);
* a buffer filled piece by piece after its allocation, until every byte a tensor covers was
  written: DeepSeek's latent attention allocates ``key_states = kv.new_empty(...)`` and fills it
  with ``key_states[..., :k].copy_(a)`` then ``key_states[..., k:].copy_(b)``; between the two,
  the second slice is still garbage and the whole buffer is only *partly written*;
* opaque handles: 0-dim integer tensors handed to a custom kernel (vLLM's ``_C.onednn_mm`` gets
  the address of its packed oneDNN weights), which differ between processes.

Writes are tracked per storage, byte by byte: a tensor is *written* when every byte it covers
was written, *unwritten* when none was, *partly written* otherwise (both of the latter recorded
without data). A write is what a custom op's schema writes, an ``out=`` argument, or an in-place
Tensor method on ``self``: the elements ``__setitem__`` / ``index_put_`` / ``masked_fill_`` /
``index_copy_`` / ``scatter_`` address, all of ``self`` for the others (``copy_``, ``fill_``,
``zero_``). Memory the allocator hands out again counts as written as soon as an op returns a
fresh tensor in it.

Limits: a buffer over :data:`MAX_TRACKED_BYTES` is tracked as a whole (its first write counts as
writing all of it), since the byte mask lives in host memory. Writes from outside torch (a numpy
view, ``.data`` through a kernel torch does not see) are not seen.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable
from typing import Any, Literal

import torch

from ._records import GARBAGE_MEMORY

#: Calls (``kind.op``) that return uninitialized memory.
EMPTY_APIS = frozenset(
    {"Torch.empty", "Torch.empty_like", "Torch.empty_strided", "Tensor.new_empty",
     "Tensor.new_empty_strided", "Aten.empty.memory_format", "Aten.empty_like"}
)  # fmt: skip

#: Buffers up to this size are tracked byte by byte; larger ones as a whole.
MAX_TRACKED_BYTES = 1 << 28

#: The record's ``memory`` member: why a tensor is recorded without data (``unwritten``,
#: ``partly written``), or that its data was assembled by writes into slices of an ``empty``
#: buffer (``filled``: no call put it out whole, so a comparison does not take it for a weight).
State = Literal["unwritten", "partly written", "filled"]


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


#: In-place operators among the dunder methods (``__getitem__`` ends with ``_`` too, and reads).
_IN_PLACE_DUNDERS = frozenset(
    {"__setitem__", "__iadd__", "__isub__", "__imul__", "__itruediv__", "__ifloordiv__",
     "__imod__", "__ipow__", "__iand__", "__ior__", "__ixor__", "__ilshift__", "__irshift__",
     "__imatmul__"}
)  # fmt: skip


def _in_place(op: str) -> bool:
    """Whether the Tensor method ``op`` writes ``self``: ``add_``, ``copy_``, ``__setitem__``."""
    return op in _IN_PLACE_DUNDERS if op.startswith("__") else op.endswith("_")


def _bytes_of(t: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The bytes of the storage mask that ``t``'s elements cover: shape ``(*t.shape, itemsize)``."""
    size = t.element_size()
    return mask.as_strided(
        (*t.shape, size), (*(s * size for s in t.stride()), 1), t.storage_offset() * size
    )


def _marked(t: torch.Tensor, mark: Callable[[torch.Tensor], Any]) -> torch.Tensor:
    """Which elements of ``t`` a call addresses: ``mark`` sets them in a False tensor like ``t``."""
    where = torch.zeros(t.shape, dtype=torch.bool, device=t.device)
    mark(where)
    return where.cpu()


def _scatter(where: torch.Tensor, dim: Any, index: Any) -> object:
    return where.scatter_(dim, index, True)


#: In-place Tensor methods that write only some elements of ``self``: how to mark them
#: (``where`` is a False bool tensor shaped like ``self``; ``a`` the call's arguments).
_REGIONS: dict[str, Callable[[torch.Tensor, tuple[Any, ...]], object]] = {
    "__setitem__": lambda where, a: where.__setitem__(a[1], True),
    "index_put_": lambda where, a: where.index_put_(tuple(a[1]), where.new_ones(())),
    "masked_fill_": lambda where, a: where.masked_fill_(a[1], True),
    "masked_scatter_": lambda where, a: where.masked_fill_(a[1], True),
    "index_fill_": lambda where, a: where.index_fill_(a[1], a[2], True),
    "index_copy_": lambda where, a: where.index_fill_(a[1], a[2], True),
    "index_add_": lambda where, a: where.index_fill_(a[1], a[2], True),
    "scatter_": lambda where, a: _scatter(where, a[1], a[2]),
    "scatter_add_": lambda where, a: _scatter(where, a[1], a[2]),
    "scatter_reduce_": lambda where, a: _scatter(where, a[1], a[2]),
}


class _Buffer:
    """One storage allocated by an ``empty`` op: which of its bytes were written since."""

    __slots__ = ("count", "holders", "mask", "nbytes")

    def __init__(self, allocated: torch.Tensor) -> None:
        #: the tensors known to hold the storage: what the ``empty`` op returned and the views
        #: taken of it (``out = torch.empty(...); out = out.view(...)`` drops the first, as
        #: vLLM's attention does); once none lives, the memory may be handed out again (by
        #: calls capture does not see)
        self.holders = [weakref.ref(allocated)]
        self.nbytes = allocated.untyped_storage().nbytes()
        self.mask: torch.Tensor | None = None  # None: nothing written yet
        self.count = 0  # bytes set in mask, at most (overlapping writes count twice)

    def alive(self) -> bool:
        return any(holder() is not None for holder in self.holders)

    def hold(self, view: torch.Tensor) -> None:
        self.holders = [h for h in self.holders if h() is not None]
        self.holders.append(weakref.ref(view))

    def write(self, t: torch.Tensor, region: torch.Tensor | None) -> bool:
        """Note that ``t`` (its elements where ``region`` is True) was written; whether the
        whole buffer now is."""
        if self.mask is None:
            whole = t.storage_offset() == 0 and t.is_contiguous()
            if self.nbytes > MAX_TRACKED_BYTES or (
                region is None and whole and t.numel() * t.element_size() >= self.nbytes
            ):
                return True
            self.mask = torch.zeros(self.nbytes, dtype=torch.bool)
        view = _bytes_of(t, self.mask)
        if region is None:
            view.fill_(True)
            self.count += view.numel()
        else:
            view[region] = True
            self.count += int(region.sum()) * t.element_size()
        return self.count >= self.nbytes and bool(self.mask.all())

    def state(self, t: torch.Tensor) -> State | None:
        if self.mask is None:
            return "unwritten"
        view = _bytes_of(t, self.mask)
        if bool(view.all()):
            return None
        return "partly written" if bool(view.any()) else "unwritten"


class UninitializedMemory:
    """Storages (by data pointer) allocated by an ``empty`` op and not wholly written since."""

    def __init__(self) -> None:
        self._buffers: dict[int, _Buffer] = {}
        #: storages wholly written piece by piece since their allocation
        self._filled: dict[int, _Buffer] = {}

    def written(self, values: Iterable[Any]) -> None:
        """Every element of each tensor in ``values`` was written."""
        if self._buffers:
            for t in _tensors(values):
                self._write(t, None)

    def _write(self, t: torch.Tensor, region: torch.Tensor | None) -> None:
        pointer = _storage(t)
        if pointer is None or (buffer := self._buffer(pointer)) is None:
            return
        with torch._C.DisableTorchFunction():
            try:
                done = buffer.write(t, region)
            except (RuntimeError, IndexError):  # a layout the mask cannot follow
                done = True
        if done:
            del self._buffers[pointer]
            if buffer.mask is not None:  # filled piece by piece
                self._filled[pointer] = buffer

    def after_call(
        self, api: str, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any
    ) -> None:
        """Note what a call allocated or wrote: an ``empty`` op's output; the ``out=`` argument,
        what an in-place method wrote of ``self``; any fresh output (memory the allocator handed
        out again now holds data; a view shares an input's storage and is not fresh)."""
        if api in EMPTY_APIS:
            for t in _tensors([output]):
                if (p := _storage(t)) is not None:
                    self._buffers[p] = _Buffer(t)
                    self._filled.pop(p, None)
            return
        if not self._buffers and not self._filled:
            return
        if "out" in kwargs:
            self.written([kwargs["out"]])
        kind, _, op = api.partition(".")
        if args and kind == "Tensor" and _in_place(op):
            self._write_self(op, args)
        inputs = {_storage(t) for t in _tensors([*args, *kwargs.values()])}
        for t in _tensors([output]):
            if (p := _storage(t)) is None:
                continue
            if p not in inputs:
                self._buffers.pop(p, None)
                self._filled.pop(p, None)
            elif (held := self._buffers.get(p) or self._filled.get(p)) is not None:
                held.hold(t)  # a view keeps the buffer's memory from being handed out again

    def _write_self(self, op: str, args: tuple[Any, ...]) -> None:
        target = args[0]
        if not isinstance(target, torch.Tensor) or _storage(target) not in self._buffers:
            return
        region = None
        if (mark := _REGIONS.get(op)) is not None:
            with torch._C.DisableTorchFunction():
                try:
                    region = _marked(target, lambda where: mark(where, args))
                except (RuntimeError, IndexError, TypeError, ValueError):
                    region = None  # an index the mark cannot follow: all of self, as before
        self._write(target, region)

    def handles(self, args: tuple[Any, ...]) -> None:
        """Note the 0-dim integer tensors among a custom op's arguments (opaque handles)."""
        for t in _tensors(args):
            if t.dim() == 0 and not t.is_floating_point() and (p := _storage(t)) is not None:
                self._buffers[p] = _Buffer(t)

    def state(self, t: torch.Tensor) -> State | None:
        """``"unwritten"`` when no byte of ``t`` was written since an ``empty`` op allocated it,
        ``"partly written"`` when some were, ``"filled"`` when all were, piece by piece, ``None``
        when it was never empty or one write filled it."""
        if not self._buffers and not self._filled:
            return None
        pointer = _storage(t)
        if pointer is None:
            return None
        if (buffer := self._buffer(pointer)) is None:
            filled = self._filled.get(pointer)
            if filled is not None and not filled.alive():
                del self._filled[pointer]
                return None
            return None if filled is None else "filled"
        with torch._C.DisableTorchFunction():
            try:
                return buffer.state(t)
            except RuntimeError:  # a layout the mask cannot follow: as allocated
                return "unwritten"

    def _buffer(self, pointer: int) -> _Buffer | None:
        """The buffer tracked at ``pointer``, while what its ``empty`` op returned lives."""
        buffer = self._buffers.get(pointer)
        if buffer is not None and not buffer.alive():
            del self._buffers[pointer]
            return None
        return buffer

    def holds(self, t: torch.Tensor) -> bool:
        """Whether ``t`` lies in memory not wholly written since an ``empty`` op allocated it."""
        return self.state(t) in GARBAGE_MEMORY

    def clear(self) -> None:
        self._buffers.clear()
        self._filled.clear()
