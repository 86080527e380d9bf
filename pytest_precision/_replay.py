"""Rerunning one recorded op from a dump: find its callable, rebuild its arguments, call it,
and say whether a wrong output is the op's fault (:func:`replay_op`).

This is what replay verdicts and first-divergence localization stand on: given the inputs an op
really received, does the op alone give the recorded output, and what would it give in float64?
Names are resolved as attribute lookups at call time, never evaluated, so a patched function
(``torch_npu`` and serving frameworks patch torch at import) is the one that reruns.
See ``docs/replay.md`` for the mapping, the verdicts and what cannot be replayed.
"""

from __future__ import annotations

import difflib
import functools
import importlib
import inspect
import operator
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F

from ._compare import as_dump, lowest_float
from ._devices import backend_of
from ._errors import PrecisionError, PrecisionInputError
from ._standards import TensorComparison, judge_rounding
from .dump._leaves import output_leaves
from .dump._records import Call, Dump, Record
from .dump._safe_io import dtype_name


class NotReplayable(PrecisionError):
    """A recorded call cannot be rerun; str(exc) says why in one line (shown to users)."""


# -- what cannot be rerun ------------------------------------------------------------------------

#: Ops that draw random numbers: a rerun draws different ones (names without ``_`` around them).
# fmt: off
_RANDOM = frozenset({
    "rand", "rand_like", "randn", "randn_like", "randint", "randint_like", "randperm",
    "bernoulli", "multinomial", "normal", "uniform", "exponential", "geometric", "cauchy",
    "log_normal", "random", "poisson", "binomial", "gumbel_softmax", "fused_dropout",
    "rrelu_with_noise",
})
# fmt: on
#: Ops that are random only when training: name -> (position of the flag, its default in
#: ``torch.nn.functional``; the ``torch.*`` and aten forms require it).
_RANDOM_WHEN_TRAINING = {
    **dict.fromkeys(
        ("dropout", "dropout1d", "dropout2d", "dropout3d", "feature_dropout", "native_dropout"),
        (2, True),
    ),
    **dict.fromkeys(("alpha_dropout", "feature_alpha_dropout"), (2, False)),
    "rrelu": (3, False),
}
#: Ops whose output is uninitialized memory (or partly: ``resize_`` growing a tensor).
_UNINITIALIZED = ("empty", "new_empty", "resize")
#: Collective communication: the other ranks are not there to rerun with. ``gather``,
#: ``scatter``, ``reduce`` and ``broadcast`` are collectives only as ``Distributed`` calls:
#: ``Tensor.gather`` and ``Tensor.scatter_`` are everyday ops.
# fmt: off
_COMMUNICATION = frozenset({
    "all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "reduce_scatter",
    "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "send", "recv", "isend",
    "irecv", "barrier", "allgather_base", "reduce_scatter_base",
})
# fmt: on
#: In-place operators that are dunders (other in-place ops end with one ``_``).
# fmt: off
_INPLACE_DUNDERS = frozenset({
    "__iadd__", "__isub__", "__imul__", "__itruediv__", "__idiv__", "__ifloordiv__", "__imod__",
    "__ipow__", "__imatmul__", "__iand__", "__ior__", "__ixor__", "__ilshift__", "__irshift__",
    "__setitem__",
})
# fmt: on
#: Tensor methods whose name is a floating dtype: at a replay precision they cast to it instead.
_FLOAT_CASTS = frozenset({"half", "bfloat16", "float", "double"})

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _base_name(call: Call) -> str:
    """The op without an aten overload (``add_.Tensor`` -> ``add_``)."""
    return call.op.split(".", 1)[0]


def is_inplace(call: Call) -> bool:
    name = _base_name(call)
    return name in _INPLACE_DUNDERS or (name.endswith("_") and not name.endswith("__"))


def _refuse_by_name(call: Call) -> None:
    """Raise NotReplayable for ops whose rerun says nothing about the recorded output."""
    name = _base_name(call).strip("_")
    if call.kind == "Distributed" or name in _COMMUNICATION:
        raise NotReplayable(
            f"{call.name} is a communication op: the other ranks are not there to rerun it with"
        )
    if name.startswith(_UNINITIALIZED):
        raise NotReplayable(
            f"{call.name} returns uninitialized memory: its recorded output is garbage, "
            "not a result to reproduce"
        )
    if name in _RANDOM:
        raise NotReplayable(f"{call.name} is a random op: a rerun draws different numbers")
    if name == "scaled_dot_product_attention" and _argument_value(call, 4, "dropout_p"):
        raise NotReplayable(f"{call.name} is a random op: dropout_p > 0 draws a fresh mask")
    if name in _RANDOM_WHEN_TRAINING:
        position, default = _RANDOM_WHEN_TRAINING[name]
        if _training_flag(call, position, default) is not False:
            raise NotReplayable(
                f"{call.name} is a random op: {name} with training=True draws a fresh mask"
            )


def _argument_value(call: Call, position: int, keyword: str) -> Any:
    for record in call.inputs:
        if record.slot in (f"input.{position}", f"kwargs.{keyword}"):
            return record.value
    return None


def _training_flag(call: Call, position: int, default: bool) -> Any:
    slots = {f"input.{position}", "kwargs.training", "kwargs.train"}
    for record in call.inputs:
        if record.slot in slots:
            return record.value
    return default


# -- finding the callable ------------------------------------------------------------------------


def _attribute(owner: Any, name: str) -> Any:
    """``owner.name`` for a plain identifier that is not a dunder, else None (never eval'd)."""
    if not _IDENTIFIER.fullmatch(name) or name.startswith("__"):
        return None
    try:
        return getattr(owner, name, None)
    except RuntimeError:  # torch.ops namespaces raise for unknown names on some versions
        return None


#: ``Torch.<prefix>X`` names torch functions of submodules (``torch.linalg.vector_norm``'s
#: ``__name__`` is ``linalg_vector_norm``): prefix -> submodule.
_TORCH_SUBMODULES = {"linalg_": "linalg", "special_": "special", "fft_": "fft"}


def _torch_function(op: str, call: Call) -> Any:
    found = _attribute(torch, op)
    if found is not None:
        return found
    for prefix, submodule in _TORCH_SUBMODULES.items():
        if op.startswith(prefix):
            return _attribute(getattr(torch, submodule), op.removeprefix(prefix))
    if op.startswith("npu_"):  # a torch_npu function seen by capture's torch-function mode
        return _npu_op(op, call)
    return None


def _tensor_method(op: str) -> Any:
    """``torch.Tensor.op``, dunders included; a property (``T``, ``mT``) is read off the input."""
    if not _IDENTIFIER.fullmatch(op):
        return None
    found = getattr(torch.Tensor, op, None)
    if inspect.isdatadescriptor(found):
        return operator.attrgetter(op)
    return found


def _aten_op(op: str) -> Any:
    """``torch.ops.aten.add.Tensor`` for ``add.Tensor``, the overload packet for ``add``."""
    name, _, overload = op.partition(".")
    found = _attribute(torch.ops.aten, name)
    return found if found is None or not overload else _attribute(found, overload)


def _npu_op(op: str, call: Call) -> Any:
    try:
        torch_npu = importlib.import_module("torch_npu")
    except ImportError as exc:
        raise NotReplayable(
            f"{call.name} is an Ascend NPU op: replaying it needs torch_npu, which cannot be "
            f"imported here ({exc}); rerun it on a machine with torch_npu"
        ) from None
    found = _attribute(torch_npu, op)
    return found if found is not None else _attribute(torch.ops.npu, op)


#: How each kind of call name maps to a callable; None when the name is unknown.
_FINDERS: dict[str, Callable[[str, Call], Any]] = {
    "Functional": lambda op, call: _attribute(F, op),
    "Torch": _torch_function,
    "Tensor": lambda op, call: _tensor_method(op),
    "Aten": lambda op, call: _aten_op(op),
    "VF": lambda op, call: _attribute(torch._VF, op),
    "NPU": _npu_op,
    "Npu": _npu_op,
}


def resolve_op(call: Call) -> Callable[..., Any]:
    """The callable a recorded op name refers to, looked up now (a patched function is the one
    under test). Raises NotReplayable for module calls, unknown names, backward calls,
    uninitialized-memory, random and communication ops, and NPU ops without torch_npu."""
    if call.kind == "Module":
        raise NotReplayable(
            f"{call.name} is a module's forward, not an op: replay reruns single ops "
            "(capture at level='op' or 'mix' to record the ops inside it)"
        )
    if ".backward" in call.name or ".parameters_grad" in call.name:
        raise NotReplayable(f"{call.name} is a backward call: replay reruns forward ops only")
    finder = _FINDERS.get(call.kind)
    if finder is None and call.kind != "Distributed":
        raise NotReplayable(
            f"{call.name}: calls of kind {call.kind!r} cannot be replayed "
            f"(replay knows {', '.join(sorted(_FINDERS))})"
        )
    _refuse_by_name(call)
    assert finder is not None  # Distributed was refused above
    found = finder(call.op, call)
    if found is None or not callable(found) or inspect.isclass(found):
        raise NotReplayable(
            f"{call.name}: no {call.kind} op {call.op!r} in this torch ({torch.__version__})"
        )
    return found  # type: ignore[no-any-return]


# -- rebuilding the arguments --------------------------------------------------------------------

#: Values recorded as strings that torch wants back as objects (``"torch.float32"``).
_TORCH_OBJECTS = (torch.dtype, torch.memory_format, torch.layout)


class _Leaf:
    """One recorded value in the slot tree (a dict could be a container of slots)."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


def _decoded(value: Any) -> Any:
    """A recorded JSON value as torch expects it: dtype strings back to ``torch.dtype`` etc."""
    if isinstance(value, str) and value.startswith("torch."):
        found = getattr(torch, value.removeprefix("torch."), None)
        return found if isinstance(found, _TORCH_OBJECTS) else value
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


# -- rerunning -----------------------------------------------------------------------------------


def _at_precision(value: Any, dtype: torch.dtype) -> Any:
    """``value`` with every floating dtype in it replaced by ``dtype``."""
    if isinstance(value, torch.dtype):
        return dtype if value.is_floating_point else value
    if isinstance(value, (tuple, list)):
        return type(value)(_at_precision(item, dtype) for item in value)
    if isinstance(value, dict):
        return {key: _at_precision(item, dtype) for key, item in value.items()}
    return value


def _on_device(
    call: Call, args: tuple[Any, ...], kwargs: dict[str, Any], device: torch.device
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Device arguments (``device=``, ``Tensor.to("cuda:0")``) point at the rerun's device."""
    if kwargs.get("device") is not None:
        kwargs = {**kwargs, "device": device}
    if call.kind == "Tensor" and call.op == "to":
        args = tuple(device if isinstance(arg, str) else arg for arg in args)
    return args, kwargs


def _check_outputs(call: Call, outputs: dict[str, torch.Tensor]) -> None:
    """The rerun's tensors sit in the recorded slots with the recorded shapes; anything else
    means the arguments were not rebuilt the way the op received them."""
    if not call.outputs:
        return  # nothing recorded to pair with (the call raised during capture)
    recorded = {r.slot: r.shape for r in call.outputs if r.is_tensor}
    if recorded.keys() != outputs.keys():
        raise NotReplayable(
            f"{call.name}: the rerun gave tensors in {sorted(outputs) or 'no slot'}, the dump "
            f"records {sorted(recorded) or 'none'}"
        )
    for slot, shape in recorded.items():
        if shape is not None and tuple(outputs[slot].shape) != shape:
            raise NotReplayable(
                f"{call.name}: the rerun gave {slot} of shape {list(outputs[slot].shape)}, the "
                f"dump records {list(shape)}: its arguments could not be rebuilt faithfully"
            )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


def recompute(
    call: Call, *, dtype: torch.dtype | None = torch.float64, device: str | torch.device = "cpu"
) -> dict[str, torch.Tensor]:
    """Rerun the op on ``device``; its tensor outputs by slot (``output.0``, ``output.0.1``),
    keyed like ``call.outputs``.

    With ``dtype``, floating-point tensor inputs are converted to it and every floating dtype
    argument (softmax's ``dtype=torch.float32``, ``Tensor.to(torch.bfloat16)``, ``.half()``) is
    replaced by it, so the whole op runs at that precision; ``dtype=None`` keeps the recorded
    dtypes (on CPU a rerun then reproduces the recorded output bitwise). Integer and bool tensors
    keep their dtype; in-place ops run on fresh copies. Raises NotReplayable with a one-line
    reason when the op cannot be resolved, its arguments rebuilt, or it raises.
    """
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise PrecisionInputError(f"dtype must be a floating torch.dtype or None, got {dtype!r}")
    func = resolve_op(call)
    target = torch.device(device)
    copy = is_inplace(call)

    def convert(tensor: torch.Tensor) -> torch.Tensor:
        new_dtype = dtype if dtype is not None and tensor.is_floating_point() else tensor.dtype
        return tensor.to(device=target, dtype=new_dtype, copy=copy)

    args, kwargs = rebuild_arguments(call, convert=convert)
    if dtype is not None:
        args, kwargs = _at_precision(args, dtype), _at_precision(kwargs, dtype)
        if call.kind == "Tensor" and call.op in _FLOAT_CASTS:
            func = functools.partial(_cast_to, dtype)
    args, kwargs = _on_device(call, args, kwargs, target)
    try:
        with torch.no_grad():
            result = func(*args, **kwargs)
    except Exception as exc:  # the op's own error, whatever its type, is the reason
        raise NotReplayable(f"{call.name} raised when rerun: {_first_line(exc)}") from exc
    outputs = {
        slot: value for slot, value in output_leaves(result) if isinstance(value, torch.Tensor)
    }
    _check_outputs(call, outputs)
    if dtype is None:
        _check_output_dtypes(call, outputs)
    return outputs


def _check_output_dtypes(call: Call, outputs: dict[str, torch.Tensor]) -> None:
    """At the recorded dtypes the rerun must give the recorded dtypes; otherwise the recorded
    run chose another kernel (``torch.autocast``, a dtype policy) and the rerun tests another."""
    for record in call.outputs:
        rerun = outputs.get(record.slot)
        if record.is_tensor and rerun is not None and record.dtype != dtype_name(rerun.dtype):
            raise NotReplayable(
                f"{call.name}: the rerun gives {record.slot} in {dtype_name(rerun.dtype)}, the "
                f"dump records {record.dtype}: the op ran under torch.autocast or another "
                "dtype policy, so a plain rerun would test another kernel"
            )


def _cast_to(dtype: torch.dtype, tensor: torch.Tensor, **kwargs: Any) -> torch.Tensor:
    """``tensor.float()`` and friends at the replay precision."""
    return tensor.to(dtype, **kwargs)


# -- verdicts ------------------------------------------------------------------------------------

Verdict = Literal["noise", "context", "op-bug"]
#: Worst first: a call's verdict is the worst of its output slots'.
_SEVERITY: dict[Verdict, int] = {"noise": 0, "context": 1, "op-bug": 2}


@dataclass(frozen=True)
class SlotReplay:
    """One output slot of a replayed call, each side judged against the float64 rerun."""

    slot: str
    verdict: Verdict
    #: what the dump recorded
    recorded: TensorComparison
    #: the op rerun alone on the device, at the recorded dtypes
    rerun: TensorComparison
    #: the golden dump's recorded output, when a golden was given and its shape matches
    golden: TensorComparison | None = None


@dataclass(frozen=True)
class ReplayResult:
    """What :func:`replay_op` found: the verdict on one recorded op on one device."""

    name: str
    module: str | None
    step: int
    rank: int
    device: str
    #: the lowest floating precision among the call's tensors, whose rounding envelope judges
    precision: str
    verdict: Verdict
    reason: str
    slots: tuple[SlotReplay, ...]
    #: where the dump (and the golden, if any) came from
    dump: str
    golden: str | None = None

    @property
    def passed(self) -> bool:
        """False only for ``op-bug``: the op itself computes wrong on this device."""
        return self.verdict != "op-bug"

    def report(self) -> str:
        from .report._replay import replay_text

        return replay_text(self)


def replay_op(
    dump: Dump | str | os.PathLike[str],
    name: str,
    device: str | torch.device = "cpu",
    *,
    golden: Dump | str | os.PathLike[str] | None = None,
    step: int | None = None,
    rank: int | None = None,
) -> ReplayResult:
    """Rerun the recorded op ``name`` alone on ``device`` and say whose fault a difference is.

    Each output slot is judged by the rounding envelope of its own dtype against a float64 CPU
    rerun (indices and masks against the CPU rerun at the recorded dtypes; see
    :class:`Reference`): the recorded output, the op rerun alone on ``device`` at the recorded
    dtypes, and the golden's recorded output (reported only). The verdict is ``op-bug`` when
    the rerun lands outside the envelope (the op alone reproduces a wrong output), ``context``
    when only the recorded output does (the op is right; its surroundings were not), ``noise``
    otherwise. ``step`` and ``rank`` choose among calls of the same name. Raises
    :class:`NotReplayable` (module calls, statistics-only dumps, ...) and
    :class:`PrecisionInputError` (unknown name, unavailable device) with a one-line reason.
    """
    target = as_dump(dump)
    call = find_call(target, name, step=step, rank=rank)
    backend_device = _available_device(device)
    golden_dump = None if golden is None else as_dump(golden)
    golden_call = (
        None
        if golden_dump is None
        else find_call(golden_dump, name, step=call.step, rank=call.rank)
    )
    reference = Reference(call)
    rerun = recompute(call, dtype=None, device=backend_device)
    golden_outputs = {} if golden_call is None else {r.slot: r for r in golden_call.outputs}
    slots = []
    for record in call.outputs:
        recorded_judged = None
        if record.slot in reference.exact:
            recorded_judged = reference.judge(record.slot, _loaded(call, record), saturate=True)
        if recorded_judged is None:
            continue  # not a tensor: nothing to judge
        rerun_judged = reference.judge(record.slot, rerun[record.slot].cpu(), saturate=True)
        assert rerun_judged is not None  # recompute checked slots and shapes
        other = golden_outputs.get(record.slot)
        golden_data = None if other is None else other.load()
        slots.append(
            _judge_slot(
                record.slot,
                recorded_judged,
                rerun_judged,
                None if golden_data is None else reference.judge(record.slot, golden_data),
            )
        )
    precision = lowest_float(call.outputs)
    overflowed = reference.overflowed
    verdict = max((s.verdict for s in slots), key=_SEVERITY.__getitem__, default="noise")
    return ReplayResult(
        name=call.name,
        module=call.module,
        step=call.step,
        rank=call.rank,
        device=str(backend_device),
        precision=str(precision).removeprefix("torch."),
        verdict=verdict,
        reason=_reason(verdict, slots, str(backend_device), precision)
        + (
            f"; the float64 result overflows {dtype_name(precision)} ({', '.join(overflowed)}), "
            "where +-inf is the right answer: a range problem of the model, not of the op"
            if overflowed
            else ""
        ),
        slots=tuple(slots),
        dump=str(target.path),
        golden=None if golden_dump is None else str(golden_dump.path),
    )


class Reference:
    """What a correct op gives for a recorded call, judged output by output: the float64 rerun
    for floats (within the rounding of the output's dtype), the CPU rerun at the recorded
    dtypes for indices and masks (``x > 0.1`` compares with 0.1 rounded to the input's dtype,
    which the float64 rerun does not)."""

    def __init__(self, call: Call) -> None:
        self.call = call
        self.exact = recompute(call)
        self._same_dtypes: dict[str, torch.Tensor] | None = None
        #: "slot: n element(s)" for each output whose float64 result overflows its dtype
        self.overflowed: list[str] = []

    def judge(
        self, slot: str, actual: torch.Tensor, *, saturate: bool = False
    ) -> TensorComparison | None:
        """``actual`` (a recorded or rerun output) against the reference; None where the call
        has no such output. ``saturate``: where the float64 result overflows the dtype, +-inf
        is right (IEEE rounding gives it)."""
        exact = self.exact.get(slot)
        if exact is None or tuple(exact.shape) != tuple(actual.shape):
            return None
        if actual.is_floating_point():
            if saturate:
                exact = self._saturated(slot, exact, actual.dtype)
            return judge_rounding(actual, exact, actual.dtype)
        if not actual.is_complex():
            if self._same_dtypes is None:
                self._same_dtypes = recompute(self.call, dtype=None)
            exact = self._same_dtypes[slot]
        return judge_rounding(actual, exact, actual.dtype)

    def _saturated(self, slot: str, exact: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        cast = exact.to(dtype)
        over = cast.isinf() & exact.isfinite()
        count = int(over.sum())
        if not count:
            return exact
        note = f"{slot}: {count} element(s)"
        if note not in self.overflowed:
            self.overflowed.append(note)
        return torch.where(over, cast.to(exact.dtype), exact)


def find_call(dump: Dump, name: str, *, step: int | None = None, rank: int | None = None) -> Call:
    """The call named exactly ``name`` (``step`` / ``rank`` choose when it recurs)."""
    named = [c for c in dump.calls if c.name == name]
    if not named:
        close = difflib.get_close_matches(name, sorted({c.name for c in dump.calls}), n=5)
        hint = f"; close names: {', '.join(close)}" if close else ""
        raise PrecisionInputError(f"{dump.path}: no call named {name!r}{hint}")
    chosen = [
        c for c in named if (step is None or c.step == step) and (rank is None or c.rank == rank)
    ]
    if len(chosen) == 1:
        return chosen[0]
    where = ", ".join(f"step {c.step} rank {c.rank}" for c in named)
    if not chosen:
        raise PrecisionInputError(
            f"{dump.path}: {name} is recorded at {where}, not at step {step} rank {rank}"
        )
    raise PrecisionInputError(
        f"{dump.path}: {name} is recorded {len(chosen)} times ({where}); choose one with "
        "step= and rank="
    )


def _available_device(device: str | torch.device) -> torch.device:
    available, reason = backend_of(device).is_available()
    if not available:
        raise PrecisionInputError(f"device {str(device)!r} is not available: {reason}")
    return torch.device(device)


def _loaded(call: Call, record: Record) -> torch.Tensor:
    tensor = record.load()
    if tensor is None:
        raise NotReplayable(
            f"{call.name}: {record.slot} has no tensor data: the dump holds statistics only "
            "(replay needs a dump of tensors: capture mode='tensor', msprobe task 'tensor')"
        )
    return tensor


def _judge_slot(
    slot: str,
    recorded: TensorComparison,
    rerun: TensorComparison,
    golden: TensorComparison | None,
) -> SlotReplay:
    if rerun.verdict == "fail":
        verdict: Verdict = "op-bug"
    elif recorded.verdict == "fail":
        verdict = "context"
    else:
        verdict = "noise"
    return SlotReplay(slot, verdict, recorded, rerun, golden)


def _reason(verdict: Verdict, slots: list[SlotReplay], device: str, precision: torch.dtype) -> str:
    envelope = f"{str(precision).removeprefix('torch.')} rounding of the float64 result"
    if not slots:
        return "the op returns no tensor to judge"
    if verdict == "noise":
        return f"the recorded output and the op rerun alone on {device} are within {envelope}"
    worst = next(s for s in slots if s.verdict == verdict)
    if verdict == "op-bug":
        return (
            f"the op rerun alone on {device} lands outside {envelope} ({worst.slot}: "
            f"{worst.rerun.reason}): it computes wrong by itself"
        )
    return (
        f"the op rerun alone on {device} is within {envelope}, but the recorded {worst.slot} "
        f"is not ({worst.recorded.reason}): the op is right, what ran around it was not "
        "(memory stomping, stale state, another code path)"
    )
