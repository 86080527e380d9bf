"""Capture of module and operator tensors during a forward, streamed to a native dump.

Modules are observed with forward pre/post hooks; operators with a ``TorchFunctionMode``, which
sees every torch-level call (``torch.*``, ``torch.nn.functional.*``, Tensor methods and
operators) without a list of ops to maintain. Capture only observes: hooks return nothing and the
mode calls the original function with the original arguments, so outputs stay bitwise the same,
with one exception: modules with a fused fast path that torch takes only when no torch-function
mode is active (``nn.MultiheadAttention``, ``nn.TransformerEncoderLayer`` in eval mode) run their
regular path at the op and mix levels, which may change the last bits; capture warns about them.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import itertools
import sys
import warnings
import weakref
from collections.abc import Collection, Hashable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from .._errors import PrecisionInputError, PrecisionWarning
from ._native import encode_value
from ._safe_io import dtype_name
from ._writer import DumpWriter, summarize

Level = Literal["module", "op", "mix"]
Mode = Literal["tensor", "statistics"]

#: Tensor methods that only read metadata; calls of these (and property reads such as
#: ``.shape``) become records only if they return a tensor.
# fmt: off
_METADATA = frozenset({
    "size", "dim", "ndimension", "numel", "nelement", "stride", "storage_offset",
    "is_contiguous", "is_floating_point", "is_complex", "is_signed", "element_size", "data_ptr",
    "get_device", "is_pinned", "has_names", "untyped_storage",
    "__len__", "__repr__", "__format__", "__hash__", "__dir__",
})
# fmt: on


@dataclass(frozen=True)
class _Call:
    """One call being captured: the fields every record of the call shares."""

    name: str
    kind: str
    op: str
    module: str
    parent: str | None
    keep: bool


# -- naming operators ------------------------------------------------------------------------------


@functools.cache
def _functional_names() -> dict[Any, str]:
    """``torch.nn.functional``'s public callables, by object (``F.linear`` is a torch builtin)."""
    return {
        obj: name
        for name in dir(F)
        if not name.startswith("_") and callable(obj := getattr(F, name, None))
    }


def _classify(func: Any) -> tuple[str, str, bool]:
    """(kind, op name, is a property read) of a function seen by ``__torch_function__``."""
    functional = _functional_names().get(func) if isinstance(func, Hashable) else None
    if functional is not None:
        return "Functional", functional, False
    owner = getattr(func, "__self__", None)
    if type(owner).__name__ == "getset_descriptor":  # a Tensor property such as .T or .shape
        return "Tensor", owner.__name__, True
    name = getattr(func, "__name__", None) or type(func).__name__
    qualname = getattr(func, "__qualname__", "") or ""
    if qualname.startswith(("TensorBase.", "Tensor.")):
        return "Tensor", name, False
    return "Torch", name, False


_classify_cached = functools.lru_cache(maxsize=4096)(_classify)


def _op_kind_and_name(func: Any) -> tuple[str, str, bool]:
    return _classify_cached(func) if isinstance(func, Hashable) else _classify(func)


# -- walking values --------------------------------------------------------------------------------


def _items(value: Any) -> Iterator[tuple[str, Any]] | None:
    """(key, item) pairs of a container (tuple, list, mapping, dataclass), None otherwise."""
    if isinstance(value, (tuple, list)):
        return ((str(i), item) for i, item in enumerate(value))
    if isinstance(value, Mapping):
        return ((str(k), item) for k, item in value.items())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return ((f.name, getattr(value, f.name)) for f in dataclasses.fields(value))
    return None


def _has_tensor(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    items = _items(value)
    return items is not None and any(_has_tensor(item) for _, item in items)


def _leaves(slot: str, value: Any) -> Iterator[tuple[str, Any]]:
    """(slot, leaf) pairs: containers holding tensors are opened, anything else is one leaf."""
    items = _items(value) if _has_tensor(value) and not isinstance(value, torch.Tensor) else None
    if items is None:
        yield slot, value
        return
    for key, item in items:
        yield from _leaves(f"{slot}.{key}", item)


def _output_slots(output: Any) -> Iterator[tuple[str, Any]]:
    items = output if isinstance(output, tuple) else (output,)
    for index, item in enumerate(items):
        yield from _leaves(f"output.{index}", item)


def _private_copy(t: torch.Tensor) -> torch.Tensor:
    """A contiguous CPU copy that later in-place ops cannot change."""
    t = t.detach().resolve_conj().resolve_neg()
    if t.device.type == "cpu":
        return t.clone(memory_format=torch.contiguous_format)
    return t.to("cpu").contiguous()


# -- the capture -----------------------------------------------------------------------------------


class _OpMode(TorchFunctionMode):
    def __init__(self, capture: Capture) -> None:
        super().__init__()
        self.capture = capture

    def __torch_function__(
        self,
        func: Any,
        types: Collection[type],
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        capture = self.capture
        if capture._busy:  # our own work
            return func(*args, **kwargs)
        kind, op, is_property = _op_kind_and_name(func)
        recording = bool(capture._stack) and capture._recording  # inside the model's forward
        metadata = is_property or op in _METADATA
        call = None
        if recording and not metadata:
            call = capture._op_call(kind, op)
            capture._record_inputs(call, args, kwargs)  # before the call: in-place ops
        output = func(*args, **kwargs)
        if recording and metadata and _has_tensor(output):  # a property such as .T
            call = capture._op_call(kind, op)
            capture._record_inputs(call, args, kwargs)
        if call is not None:
            capture._record_outputs(call, output)
        return output


class Capture:
    """A running capture (see :func:`capture`); call :meth:`step` between decode steps."""

    def __init__(
        self,
        model: torch.nn.Module,
        path: Path,
        level: Level,
        mode: Mode,
        include: tuple[str, ...] | None,
        exclude: tuple[str, ...],
        steps: frozenset[int] | None,
    ) -> None:
        self.model = model
        self.path = path
        self.level = level
        self.mode = mode
        self.include = include
        self.exclude = exclude
        self.steps = steps
        self.step_index = 0
        self._busy = False
        self._stack: list[tuple[str, str]] = []  # (record name, module path) of open module calls
        self._module_calls: dict[str, int] = {}
        self._op_calls: dict[str, int] = {}
        self._seen: dict[int, tuple[weakref.ref[torch.Tensor], int, str]] = {}
        self._keys = itertools.count()
        self._handles: list[torch.utils.hooks.RemovableHandle] = []
        self._mode: _OpMode | None = None
        self._writer: DumpWriter | None = None

    @property
    def _recording(self) -> bool:
        return self.steps is None or self.step_index in self.steps

    def step(self, step: int | None = None) -> int:
        """Start the next decode step (or step ``step``); call counters restart from 0."""
        self.step_index = self.step_index + 1 if step is None else step
        self._module_calls.clear()
        self._op_calls.clear()
        return self.step_index

    # -- lifecycle -----------------------------------------------------------------------------

    def __enter__(self) -> Capture:
        rank, world_size = _rank_and_world_size()
        info = {"level": self.level, "mode": self.mode}
        # Statistics are computed at capture time; only tensor data is worth a writer thread.
        self._writer = DumpWriter(
            self.path, rank=rank, world_size=world_size, info=info, background=self.mode == "tensor"
        )
        self._writer.start()
        names: dict[int, str] = {}
        for path, module in self.model.named_modules(remove_duplicate=False):
            names.setdefault(id(module), path)
        for module in {id(m): m for m in self.model.modules()}.values():
            path = names[id(module)]
            self._handles.append(
                module.register_forward_pre_hook(self._pre_hook(path), with_kwargs=True)
            )
            self._handles.append(
                module.register_forward_hook(
                    self._post_hook(path), with_kwargs=True, always_call=True
                )
            )
        if self.level != "module":
            _warn_about_fast_paths(self.model)
            self._mode = _OpMode(self)
            self._mode.__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._mode is not None:
            self._mode.__exit__(exc_type, exc, tb)
            self._mode = None
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._seen.clear()
        if self._writer is not None:
            self._writer.close(interrupted_by=None if exc is None else repr(exc))
            self._writer = None

    # -- hooks -----------------------------------------------------------------------------------

    def _pre_hook(self, path: str) -> Any:
        def hook(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            count = self._module_calls.get(path, 0)
            self._module_calls[path] = count + 1
            cls = type(module).__name__
            name = (
                f"Module.{path}.{cls}.forward.{count}" if path else f"Module.{cls}.forward.{count}"
            )
            parent = self._stack[-1][0] if self._stack else None
            self._stack.append((name, path))
            if self.level == "op" or not self._recording:
                return
            call = _Call(name, "Module", cls, path, parent, self._keep(name, path))
            self._record_inputs(call, args, kwargs)
            if call.keep:
                params = module.named_parameters(recurse=False)
                self._record_values(call, ((f"parameters.{n}", p) for n, p in params))

        return hook

    def _post_hook(self, path: str) -> Any:
        def hook(
            module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any
        ) -> None:
            while self._stack:  # always_call: also runs when forward raised inside a child
                name, open_path = self._stack.pop()
                if open_path == path:
                    break
            else:
                return
            # always_call hooks run from torch's exception handler when forward raised: the call
            # produced no output, so none is recorded.
            if self.level == "op" or not self._recording or sys.exc_info()[1] is not None:
                return
            parent = self._stack[-1][0] if self._stack else None
            cls = type(module).__name__
            self._record_outputs(
                _Call(name, "Module", cls, path, parent, self._keep(name, path)), output
            )

        return hook

    # -- records ---------------------------------------------------------------------------------

    def _op_call(self, kind: str, op: str) -> _Call:
        api = f"{kind}.{op}"
        count = self._op_calls.get(api, 0)
        self._op_calls[api] = count + 1
        name = f"{api}.{count}.forward"
        module = self._stack[-1][1] if self._stack else ""
        parent = self._stack[-1][0] if self._stack and self.level == "mix" else None
        return _Call(name, kind, op, module, parent, self._keep(name, module))

    def _keep(self, name: str, module: str) -> bool:
        def matches(patterns: Iterable[str]) -> bool:
            return any(
                fnmatch.fnmatchcase(name, p) or fnmatch.fnmatchcase(module, p) for p in patterns
            )

        return (self.include is None or matches(self.include)) and not matches(self.exclude)

    def _record_inputs(self, call: _Call, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if not call.keep:
            return
        values = itertools.chain(
            ((f"input.{i}", arg) for i, arg in enumerate(args)),
            ((f"kwargs.{key}", arg) for key, arg in kwargs.items()),
        )
        self._record_values(call, (leaf for slot, v in values for leaf in _leaves(slot, v)))

    def _record_outputs(self, call: _Call, output: Any) -> None:
        if call.keep:
            self._record_values(call, _output_slots(output))

    def _record_values(self, call: _Call, leaves: Iterable[tuple[str, Any]]) -> None:
        assert self._writer is not None
        self._busy = True
        try:
            for slot, value in leaves:
                entry: dict[str, Any] = {
                    "name": call.name,
                    "slot": slot,
                    "kind": call.kind,
                    "op": call.op,
                    "module": call.module,
                    "parent": call.parent,
                    "step": self.step_index,
                }
                if isinstance(value, torch.Tensor):
                    self._record_tensor(entry, value)
                else:
                    entry.update(dtype=None, shape=None, stats=None, data=None)
                    entry["value"] = encode_value(value)
                    self._writer.add(entry)
        finally:
            self._busy = False

    def _record_tensor(self, entry: dict[str, Any], t: torch.Tensor) -> None:
        assert self._writer is not None
        entry["dtype"] = dtype_name(t.dtype)
        entry["shape"] = list(t.shape)
        entry["value"] = None
        if t.layout != torch.strided or t.is_quantized or t.device.type == "meta":
            entry.update(stats=None, data=None)  # no dense data to summarize or store
            self._writer.add(entry)
            return
        version = self._version(t)
        seen = self._seen.get(id(t))
        if version is not None and seen is not None and seen[0]() is t and seen[1] == version:
            self._writer.add(entry, alias=seen[2])  # the same tensor, unchanged: share its data
            return
        key = str(next(self._keys))
        if self.mode == "tensor":
            self._writer.add(entry, key=key, tensor=_private_copy(t))
        else:
            self._writer.add(entry, key=key, stats=summarize(t))
        if version is not None:
            self._remember(t, version, key)

    @staticmethod
    def _version(t: torch.Tensor) -> int | None:
        """What tells whether ``t`` changed since it was recorded; ``None``: nothing does.

        Inference tensors have no version counter, and a write through any view of their
        storage would go unseen, so they are never shared between records.
        """
        return None if t.is_inference() else t._version

    def _remember(self, t: torch.Tensor, version: int, key: str) -> None:
        ident = id(t)

        def forget(_: object) -> None:
            if self._seen.get(ident, (None, 0, ""))[2] == key:
                del self._seen[ident]

        self._seen[ident] = (weakref.ref(t, forget), version, key)


#: Modules whose fused inference fast path is skipped while a torch-function mode is active.
_FAST_PATH_MODULES = (
    torch.nn.MultiheadAttention,
    torch.nn.TransformerEncoderLayer,
    torch.nn.TransformerEncoder,
)


def _warn_about_fast_paths(model: torch.nn.Module) -> None:
    found = sorted({type(m).__name__ for m in model.modules() if isinstance(m, _FAST_PATH_MODULES)})
    if found:
        warnings.warn(
            PrecisionWarning(
                f"capture at the op level makes {', '.join(found)} skip its fused fast path: "
                "outputs may differ in the last bits from a run without capture (use "
                "level='module' for bitwise-identical outputs)"
            ),
            stacklevel=3,
        )


def _patterns(patterns: Iterable[str] | str | None) -> tuple[str, ...] | None:
    if patterns is None:
        return None
    return (patterns,) if isinstance(patterns, str) else tuple(patterns)


def _rank_and_world_size() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def capture(
    model: torch.nn.Module,
    path: str | Path,
    *,
    level: Level = "mix",
    mode: Mode = "tensor",
    include: Iterable[str] | str | None = None,
    exclude: Iterable[str] | str | None = None,
    steps: Iterable[int] | None = None,
) -> Capture:
    """Capture the tensors of ``model``'s forwards into a native dump at ``path``.

    Use as a context manager::

        with capture(model, "dump", level="mix", mode="statistics") as cap:
            model(prompt)
            cap.step()
            model(prompt_and_first_token)

    ``level``: ``"module"`` (inputs, kwargs, parameters and outputs of every submodule),
    ``"op"`` (every torch call made inside the forward) or ``"mix"`` (both, each op attached to
    its enclosing module). ``mode``: ``"tensor"`` (data and statistics) or ``"statistics"``.
    ``include`` / ``exclude``: glob patterns matched against call names
    (``Functional.linear.*``) and module paths (``model.layers.0.*``). ``steps``: the decode
    steps to record (see :meth:`Capture.step`), all by default. Each rank writes
    ``path/rank<r>/``; the dump is complete once the ``with`` block exits.
    """
    if not isinstance(model, torch.nn.Module):
        raise PrecisionInputError(f"capture() needs a torch.nn.Module, got {type(model).__name__}")
    if level not in ("module", "op", "mix"):
        raise PrecisionInputError(f"level must be 'module', 'op' or 'mix', got {level!r}")
    if mode not in ("tensor", "statistics"):
        raise PrecisionInputError(f"mode must be 'tensor' or 'statistics', got {mode!r}")
    return Capture(
        model,
        Path(path),
        level,
        mode,
        _patterns(include),
        _patterns(exclude) or (),
        None if steps is None else frozenset(steps),
    )
