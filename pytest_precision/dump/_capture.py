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

import itertools
import sys
from collections.abc import Collection, Iterable
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

import torch
from torch.nn import Parameter
from torch.overrides import TorchFunctionMode

from .._errors import PrecisionInputError
from ._capture_scope import (
    as_patterns,
    compile_patterns,
    rank_and_world_size,
    warn_about_fast_paths,
)
from ._leaves import has_tensor, input_leaves, output_leaves, owned_cache_layers
from ._module_layouts import INSIDE, module_layouts
from ._native import json_members, json_text
from ._op_names import WAITED_COLLECTIVES, OpInfo, op_info
from ._padding import Padding, padding_of
from ._real_stats import RealStats
from ._record_json import changed_since_json, json_dtype, json_shape, json_slot, json_value
from ._recorded import RecordedTensors, wants_content
from ._records import GARBAGE_MEMORY
from ._tensor_layouts import TensorLayout, with_layout
from ._uninitialized import UninitializedMemory
from ._writer import DumpWriter, private_copy, reduced_on_device, summarize

Level = Literal["module", "op", "mix"]
Mode = Literal["tensor", "statistics"]


# -- the capture -----------------------------------------------------------------------------------

#: The fields every record of one call shares, encoded once per call (see ``json_members``).
_Head = str
#: the layouts of a module's slots when capture knows none
_NO_LAYOUTS: dict[str, TensorLayout] = {}


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
        info = op_info(func)
        if not capture._stack or not capture._recording:  # outside the recorded forwards
            return capture._unrecorded(info, func, args, kwargs)
        if not info.writes_nothing:
            return capture._record_call(info, func, args, kwargs)
        recorded = capture._recorded  # its inputs and outputs: one moment (no write between)
        recorded.begin_moment()
        try:
            return capture._record_call(info, func, args, kwargs)
        finally:
            recorded.end_moment()


def _wait_for(namespace: str, output: Any) -> None:
    """Wait for a functional collective's outputs (its ``wait_tensor`` fills them; the model's
    own ``wait_tensor`` later finds nothing left to wait for)."""
    wait_tensor = getattr(torch.ops, namespace).wait_tensor
    for _, value in output_leaves(output):
        if isinstance(value, torch.Tensor):
            wait_tensor(value)


class Capture:
    """A running capture (see :func:`capture`); call :meth:`step` between decode steps, or
    let ``step_per_forward`` start one at each top-level forward."""

    def __init__(
        self,
        model: torch.nn.Module,
        path: Path,
        level: Level,
        mode: Mode,
        include: tuple[str, ...] | None,
        exclude: tuple[str, ...],
        steps: frozenset[int] | None,
        step_per_forward: bool = False,
    ) -> None:
        self.model = model
        self.path = path
        self.level = level
        self.mode = mode
        self.include = include
        self.exclude = exclude
        self.steps = steps
        self.step_per_forward = step_per_forward
        self.step_index = 0
        self._forwards = 0  # top-level forwards begun (step_per_forward: one step each)
        self._included = compile_patterns(include)
        self._excluded = compile_patterns(exclude) if exclude else None
        self._filtered = include is not None or bool(exclude)
        self._recording = steps is None or 0 in steps
        # Open module calls: record name, module path, and the "module" and "parent" members of
        # the op records inside it.
        self._stack: list[tuple[str, str, str]] = []
        self._module_calls: dict[str, int] = {}
        self._op_calls: dict[str, int] = {}
        self._recorded = RecordedTensors(self._forget_key, any_shape=mode == "statistics")
        self._uninitialized = UninitializedMemory()  # recorded without data
        self._keys = itertools.count()
        self._handles: list[torch.utils.hooks.RemovableHandle] = []
        #: module path -> the layouts of a tensor-parallel layer's slots (``INSIDE``: its ops')
        self._layouts: dict[str, dict[str, TensorLayout]] = {}
        self._mode: _OpMode | None = None
        self._writer: DumpWriter | None = None
        #: the attention mask of the top-level forward running, where it pads
        self._padding: Padding | None = None
        self._real_stats = RealStats()

    def step(self, step: int | None = None) -> int:
        """Start the next decode step (or step ``step``); call counters restart from 0."""
        self.step_index = self.step_index + 1 if step is None else step
        self._recording = self.steps is None or self.step_index in self.steps
        self._module_calls.clear()
        self._op_calls.clear()
        return self.step_index

    # -- lifecycle -----------------------------------------------------------------------------

    def __enter__(self) -> Capture:
        rank, world_size = rank_and_world_size()
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
            if layouts := module_layouts(module):
                self._layouts[path] = layouts
            self._handles.append(
                module.register_forward_pre_hook(self._pre_hook(path), with_kwargs=True)
            )
            self._handles.append(
                module.register_forward_hook(
                    self._post_hook(path), with_kwargs=True, always_call=True
                )
            )
        if self.level != "module":
            warn_about_fast_paths(self.model)
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
        self._recorded.clear()
        self._uninitialized.clear()
        if self._writer is not None:
            self._writer.close(interrupted_by=None if exc is None else repr(exc))
            self._writer = None

    def _forget_key(self, key: str) -> None:
        if self._writer is not None:
            self._writer.forget(key)

    # -- hooks -----------------------------------------------------------------------------------

    def _pre_hook(self, path: str) -> Any:
        def hook(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            if not self._stack and self.step_per_forward:  # a top-level forward begins
                if self._forwards:
                    self.step()
                self._forwards += 1
            count = self._module_calls.get(path, 0)
            self._module_calls[path] = count + 1
            cls = type(module).__name__
            name = (
                f"Module.{path}.{cls}.forward.{count}" if path else f"Module.{cls}.forward.{count}"
            )
            parent = self._stack[-1][0] if self._stack else None
            if parent is None:
                self._padding = padding_of(args, kwargs)
            inside = {"module": path, "parent": name if self.level == "mix" else None}
            self._stack.append((name, path, json_members(inside)))
            if self.level == "op" or not self._recording or not self._keep(name, path):
                return
            head = self._head(name, "Module", cls, path, parent)
            layouts = self._layouts.get(path, _NO_LAYOUTS)
            leaves = input_leaves(args, kwargs, owned_cache_layers(module))
            mask_slot = None if parent else "kwargs.attention_mask"
            self._record_values(head, leaves, layouts, mask_slot)
            params = module.named_parameters(recurse=False)
            self._record_values(head, [(f"parameters.{n}", p) for n, p in params], layouts)

        return hook

    def _post_hook(self, path: str) -> Any:
        def hook(
            module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any
        ) -> None:
            while self._stack:  # always_call: also runs when forward raised inside a child
                name, open_path, _ = self._stack.pop()
                if open_path == path:
                    break
            else:
                return
            # always_call hooks run from torch's exception handler when forward raised: the call
            # produced no output, so none is recorded.
            if self.level == "op" or not self._recording or sys.exc_info()[1] is not None:
                return
            if self._keep(name, path):
                parent = self._stack[-1][0] if self._stack else None
                head = self._head(name, "Module", type(module).__name__, path, parent)
                layouts = self._layouts.get(path, _NO_LAYOUTS)
                self._record_values(head, output_leaves(output), layouts)
            if not self._stack:
                self._padding = None

        return hook

    # -- records ---------------------------------------------------------------------------------

    def _head(self, name: str, kind: str, op: str, module: str, parent: str | None) -> _Head:
        fields: dict[str, object] = {
            "name": name,
            "kind": kind,
            "op": op,
            "module": module,
            "parent": parent,
        }
        fields["step"] = self.step_index
        return json_members(fields)

    def _op_head(self, info: OpInfo) -> _Head | None:
        """The shared fields of the next call of an op; ``None`` when include/exclude drop it."""
        count = self._op_calls.get(info.api, 0)
        self._op_calls[info.api] = count + 1
        _, module, inside = self._stack[-1]
        if self._filtered and not self._keep(f"{info.api}.{count}.forward", module):
            return None
        name = f'{info.json_api}.{count}.forward"'  # escaped once per op, not per call
        return f'"name":{name}{info.members},{inside},"step":{self.step_index}'

    def _keep(self, name: str, module: str) -> bool:
        included, excluded = self._included, self._excluded
        if included is not None and not (included.match(name) or included.match(module)):
            return False
        return excluded is None or not (excluded.match(name) or excluded.match(module))

    def _record_call(
        self, info: OpInfo, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        """Call ``func`` and record its inputs and outputs (see ``_OpMode``)."""
        if info.metadata:
            output = func(*args, **kwargs)
            if has_tensor(output):  # a property such as .T
                head = self._op_head(info)
                if head is not None:
                    self._record_values(head, input_leaves(args, kwargs))
                    self._record_values(head, output_leaves(output))
            return output
        head = self._op_head(info)
        if head is None:
            return self._unrecorded(info, func, args, kwargs)
        if info.kind == "Custom":
            self._uninitialized.handles(args)
        self._record_values(head, input_leaves(args, kwargs))  # before the call: in-place ops
        output = func(*args, **kwargs)
        if info.kind == "Distributed" and info.mutated:
            self._record_collective(head, info, args, kwargs, output)
            return output
        if info.filled_by_wait is not None:  # else its outputs are recorded before they arrive
            _wait_for(info.filled_by_wait, output)
        self._uninitialized.after_call(info.api, args, kwargs, output)
        self._record_values(head, output_leaves(output))
        if info.mutated:  # out buffers of custom ops, as filled by the call
            written = [(f"output.{n}", v) for n, v in info.written(args, kwargs)]
            self._uninitialized.written(v for _, v in written)
            for _, v in written:  # its kernel may bump no version counter
                if isinstance(v, torch.Tensor):
                    self._recorded.written(v)
            self._record_values(head, written)
        return output

    def _record_collective(
        self,
        head: _Head,
        info: OpInfo,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        output: Any,
    ) -> None:
        """A c10d collective writes an argument in place, and may bump no version counter
        (``all_reduce``, ``broadcast`` do not): what was recorded of it before is stale. Its
        output is that argument after the call, as msprobe records it. An asynchronous
        collective (``async_op=True``) is waited for first, at the cost of its overlap (its
        work handle may be waited for again); an asynchronous receive is not (waiting twice
        for it hangs on gloo) and records no output: its reader records what it finds."""
        written = self._written_by(info, args, kwargs)
        if callable(wait := getattr(output, "wait", None)):
            if info.op not in WAITED_COLLECTIVES:
                return
            wait()
        self._record_values(head, output_leaves(written[0]))

    def _unrecorded(
        self, info: OpInfo, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        """A call not recorded (filtered out, outside the forward, a step not kept). A
        collective among them still writes its argument behind the version counter's back:
        what was recorded of it is forgotten all the same."""
        output = func(*args, **kwargs)
        if info.kind == "Distributed" and info.mutated:
            self._written_by(info, args, kwargs)
        return output

    def _written_by(self, info: OpInfo, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
        """The arguments a collective wrote (``info.mutated``): their memory now holds data,
        and nothing recorded of it before is current."""
        written = [value for _, value in info.written(args, kwargs)]
        tensors = [v for w in written for _, v in output_leaves(w) if isinstance(v, torch.Tensor)]
        self._uninitialized.written(tensors)
        for t in tensors:
            self._recorded.forget(t)
        return written

    def _record_values(
        self,
        head: _Head,
        leaves: list[tuple[str, Any]],
        layouts: dict[str, TensorLayout] | None = None,
        mask_slot: str | None = None,
    ) -> None:
        """Record each ``(slot, value)``: a module's with its ``layouts`` by slot, an op call's
        (``None``) with the layout of the tensors of calls inside its layer, if any.
        ``mask_slot``: the slot of a top-level forward's attention mask, which carries the
        forward's padding (see ``_padding``)."""
        writer = self._writer
        assert writer is not None
        inside = None
        if layouts is None and self._layouts and self._stack:
            inside = self._layouts.get(self._stack[-1][1], _NO_LAYOUTS).get(INSIDE)
        self._recorded.begin_moment()  # nothing runs between the slots of one call
        # Our own torch calls skip the op mode: a module hook runs with it active, and each
        # call through it costs a Python round trip (about 2,000 per forward at the mix level).
        try:
            with torch._C.DisableTorchFunction():
                for slot, value in leaves:
                    if isinstance(value, torch.Tensor):
                        layout = inside if layouts is None else layouts.get(slot)
                        members = f'{head},"slot":{json_slot(slot)}'
                        if slot == mask_slot and self._padding is not None:
                            members = f'{members},"padding":{json_text(self._padding.to_json())}'
                        self._record_tensor(writer, members, value, layout)
                    else:
                        encoded = json_value(value)
                        writer.add_encoded(
                            f'{head},"slot":{json_slot(slot)},"dtype":null,"shape":null,'
                            f'"value":{encoded}',
                            self.step_index,
                        )
        finally:
            self._recorded.end_moment()

    def _record_tensor(
        self, writer: DumpWriter, members: str, t: torch.Tensor, layout: TensorLayout | None
    ) -> None:
        label = members  # the call and slot, for a later record that finds t changed
        t, members = with_layout(t, members, layout)
        shape = json_shape(t.shape)
        members = f'{members},"dtype":{json_dtype(t.dtype)},"shape":{shape},"value":null'
        if t.layout is torch.strided and not t.is_contiguous():  # data is stored contiguous
            members = f'{members},"stride":{json_text(t.stride())}'
        step = self.step_index
        if t.layout is not torch.strided or t.is_quantized or t.is_meta:
            writer.add_encoded(members, step)  # no dense data to store
            return
        if (memory := self._uninitialized.state(t)) is not None:
            members = f'{members},"memory":"{memory}"'
            if memory in GARBAGE_MEMORY:  # no data worth storing
                writer.add_encoded(members, step)
                return
        recorded = self._recorded
        alias = recorded.key_of(t)  # recorded before and unchanged since: share its data
        key = alias or str(next(self._keys))
        padding = self._padding
        if (  # on an accelerator they would wait for the device per record: left out there
            padding is not None
            and self.mode == "statistics"
            and not isinstance(t, Parameter)
            and not reduced_on_device(t)
        ):  # statistics of the positions a comparison judges
            members += self._real_stats.members(padding, t, key)
        if alias is not None:
            writer.add_encoded(members, step, alias=alias)
            return
        if recorded.changed_since is not None:  # a stomp: written by no recorded call
            members = f'{members},"changed_since":{changed_since_json(recorded.changed_since)}'
        wanted = wants_content(t)  # from the read that copies or summarizes t: one read
        if self.mode == "tensor":
            copy, content = private_copy(t, wanted)
            writer.add_encoded(members, step, key=key, tensor=copy)
        else:
            stats, content = summarize(t, wanted)
            writer.add_encoded(members, step, key=key, stats=stats)
        recorded.remember(t, key, label, content)


def capture(
    model: torch.nn.Module,
    path: str | Path,
    *,
    level: Level = "mix",
    mode: Mode = "tensor",
    include: Iterable[str] | str | None = None,
    exclude: Iterable[str] | str | None = None,
    steps: Iterable[int] | None = None,
    step_per_forward: bool = False,
) -> Capture:
    """Capture the tensors of ``model``'s forwards into a native dump at ``path``.

    Use as a context manager::

        with capture(model, "dump", level="mix", mode="statistics") as cap:
            model(prompt)
            cap.step()
            model(prompt_and_first_token)

        with capture(model, "dump", step_per_forward=True):
            model.generate(prompt, max_new_tokens=8, do_sample=False)

    ``level``: ``"module"`` (inputs, kwargs, parameters and outputs of every submodule),
    ``"op"`` (every torch call made inside the forward) or ``"mix"`` (both, each op attached to
    its enclosing module). ``mode``: ``"tensor"`` (data and statistics) or ``"statistics"``.
    ``include`` / ``exclude``: glob patterns matched against call names
    (``Functional.linear.*``) and module paths (``model.layers.0.*``). ``steps``: the decode
    steps to record (see :meth:`Capture.step`), all by default. ``step_per_forward``: each
    top-level forward (one begun while no other is running) after the first starts the next
    step, so ``model.generate(...)`` inside the block records its prefill as step 0 and each
    decode step as steps 1..N (with ``steps=`` picking among them); do not call
    :meth:`Capture.step` as well. Off by default: two forwards may belong to one step (a
    prefill in chunks, a forward compared against its batch), which only the caller knows. An
    HF KV cache in an argument or output is recorded as its tensors
    (``kwargs.past_key_values.layers.0.keys``). Each rank writes ``path/rank<r>/``; the dump
    is complete once the ``with`` block exits.
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
        as_patterns(include),
        as_patterns(exclude) or (),
        None if steps is None else frozenset(steps),
        bool(step_per_forward),
    )
