"""Which callable a recorded call names, and which calls cannot be rerun at all (random,
uninitialized, communication). Names are resolved as attribute lookups at call time, never
evaluated, so a patched function (``torch_npu`` and serving frameworks patch torch at import) is
the one that reruns. See ``docs/replay.md`` for the mapping."""

from __future__ import annotations

import importlib
import inspect
import operator
import re
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from .._errors import PrecisionError
from .._text import shown
from ..dump._records import Call
from ._allowlist import refusal


class NotReplayable(PrecisionError):
    """A recorded call cannot be rerun; str(exc) says why in one line (shown to users)."""


#: Ops that draw random numbers: a rerun draws different ones (names without ``_`` around them).
# fmt: off
_RANDOM = frozenset({
    "rand", "rand_like", "randn", "randn_like", "randint", "randint_like", "randperm",
    "bernoulli", "multinomial", "normal", "uniform", "exponential", "geometric", "cauchy",
    "log_normal", "random", "poisson", "binomial", "gumbel_softmax", "fused_dropout",
    "rrelu_with_noise", "pca_lowrank", "svd_lowrank", "fractional_max_pool2d",
    "fractional_max_pool3d", "fractional_max_pool2d_with_indices",
    "fractional_max_pool3d_with_indices",
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


#: Attention that draws a dropout mask when ``dropout_p`` > 0: name -> (position of
#: ``dropout_p``, position of its training flag (default True), or None when it has none).
_ATTENTION_DROPOUT: dict[str, tuple[int, int | None]] = {
    "scaled_dot_product_attention": (4, None),
    "multi_head_attention_forward": (10, 13),
}


#: Recurrent layers that draw a dropout mask between layers when training (``torch._VF``).
_RNNS = frozenset({"lstm", "gru", "rnn_tanh", "rnn_relu"})


#: Ops whose output is uninitialized memory (or partly: ``resize_`` growing a tensor).
_UNINITIALIZED = ("empty", "new_empty", "resize")


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
    if call.collective:
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
    if name in _ATTENTION_DROPOUT:
        position, training = _ATTENTION_DROPOUT[name]
        trains = training is None or _training_flag(call, training, True) is not False
        if trains and _argument_value(call, position, "dropout_p"):
            raise NotReplayable(f"{call.name} is a random op: dropout_p > 0 draws a fresh mask")
    if name in _RNNS and _rnn_drops_out(call):
        raise NotReplayable(
            f"{call.name} is a random op: {name} with dropout > 0 and train=True draws a fresh "
            "mask between layers"
        )
    if name in _RANDOM_WHEN_TRAINING:
        position, default = _RANDOM_WHEN_TRAINING[name]
        if _training_flag(call, position, default) is not False:
            raise NotReplayable(
                f"{call.name} is a random op: {name} with training=True draws a fresh mask"
            )


def _rnn_drops_out(call: Call) -> bool:
    """Whether a recorded ``torch._VF.lstm`` / ``gru`` / ``rnn_*`` call trains with dropout.
    Their arguments are positional: ``(input, hx, params, has_biases, num_layers, dropout,
    train, ...)``, or with ``batch_sizes`` (a tensor in slot ``input.1``) after ``input``, which
    moves ``dropout`` and ``train`` one place on."""
    packed = any(r.slot == "input.1" and r.is_tensor for r in call.inputs)
    dropout = _argument_value(call, 6 if packed else 5, "dropout")
    train = _argument_value(call, 7 if packed else 6, "train")
    return bool(dropout) and train is not False


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
    uninitialized-memory, random and communication ops, NPU ops without torch_npu, and every
    function that does not compute (files, global state: see ``_allowlist``)."""
    if call.kind == "Module":
        raise NotReplayable(
            f"{call.name} is a module's forward, not an op: replay reruns single ops "
            "(capture at level='op' or 'mix' to record the ops inside it)"
        )
    if ".backward" in call.name or ".parameters_grad" in call.name:
        raise NotReplayable(f"{call.name} is a backward call: replay reruns forward ops only")
    finder = _FINDERS.get(call.kind)
    if finder is None and not call.collective:
        raise NotReplayable(
            f"{call.name}: calls of kind {call.kind!r} cannot be replayed "
            f"(replay knows {', '.join(sorted(_FINDERS))})"
        )
    _refuse_by_name(call)
    assert finder is not None  # a collective was refused above
    found = finder(call.op, call)  # an attribute lookup: nothing named is called yet
    if found is None or not callable(found) or inspect.isclass(found):
        raise NotReplayable(
            f"{call.name}: no {call.kind} op {call.op!r} in this torch ({torch.__version__})"
        )
    reason = refusal(call.kind, call.op)
    if reason is not None:
        raise NotReplayable(f"not rerun: {shown(f'{call.kind}.{call.op}')} {reason}")
    return found
