"""Which functions a rerun may call: only ones that compute.

A dump is untrusted input: its call names come from another machine or person, and the rerun
(replay, ``compare``'s float64 reference) calls what they name. A name is allowed when torch's
own operator registry describes it as a computation, so the rule follows torch instead of a
hand-kept list of ops: ``torch.<op>``, ``torch._VF.<op>`` and ``Tensor.<op>`` must be the
binding of an ``aten`` operator whose every overload schema computes (returns a value or writes
its tensor arguments, takes no file name, storage, stream, future or random generator), an
``Aten.<op>`` the overload it names. Besides those, ``torch.nn.functional``'s own Python
functions, ``torch.functional``'s, Tensor casts and properties; a private (``_``) name only as
an aten binding (``torch._grouped_mm``), a dunder only as a Tensor operator (``__iadd__``). A few
families are refused by name first, for a clear reason: files, random state, process-wide
settings, compilers, device and process level helpers. See ``docs/replay.md`` ("What a rerun
may call").
"""

from __future__ import annotations

import functools
import inspect
import re
from typing import Any

import torch
import torch.functional as torch_functional
import torch.nn.functional as F

#: Sparse constructors (torch does not check their indices unless told to), ``_unsafe_*``
#: indexing and ``segment_reduce(unsafe=True)``: a recorded index out of range segfaults.
_UNCHECKED = "skips torch's index checks: an index out of range writes outside memory"

#: Families refused by name (tested on the op without its aten overload, leading ``_`` kept
#: for ``Aten`` internals): pattern -> what the function does instead of computing.
_FAMILIES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"(^|_)save"), "writes files"),
    (
        re.compile(r"(^|_)(load|from_file|file|frombuffer|dlpack)($|_)"),
        "reads files or foreign memory",
    ),
    (re.compile(r"storage|share_memory"), "exposes memory outside the rerun"),
    (
        re.compile(r"(^|_)(manual_seed|seed|initial_seed|rng|generator|fork_rng)($|_)"),
        "touches the random number generator state",
    ),
    (
        re.compile(r"^(set_[a-z]|use_deterministic|enable_|disable_)"),
        "changes process-wide state",
    ),
    (
        re.compile(r"sparse|(^|_)(coo|csr|csc|bsr|bsc)($|_)|^_unsafe_"),
        _UNCHECKED,
    ),
    (
        re.compile(
            r"^(compile|jit|script|trace|hub|distributed|autograd|backends|ops|library|profiler"
            r"|multiprocessing|fork|wait|vmap|cond|while_loop|backward)$"
        ),
        "is a compiler, device or process level function, not a computation",
    ),
)

#: Tensor dunders that are arithmetic, comparison or indexing operators.
# fmt: off
_OPERATOR_DUNDERS = frozenset(
    f"__{prefix}{name}__"
    for name in (
        "add", "sub", "mul", "truediv", "div", "floordiv", "mod", "pow", "matmul", "and", "or",
        "xor", "lshift", "rshift",
    )
    for prefix in ("", "r", "i")
) | frozenset({
    "__neg__", "__pos__", "__abs__", "__invert__", "__eq__", "__ne__", "__lt__", "__le__",
    "__gt__", "__ge__", "__getitem__", "__setitem__",
})

#: Tensor methods that compute without an aten operator of their name (casts, device moves).
_TENSOR_CONVERSIONS = frozenset({
    "float", "half", "bfloat16", "double", "int", "long", "short", "char", "byte", "bool",
    "cfloat", "cdouble", "cpu", "cuda", "npu", "type", "unique", "lu",
})
# fmt: on

#: torch.functional's functions (einsum, split, stft, unique, ...): Python compositions of aten
#: ops, except the randomized low-rank solvers.
_TORCH_FUNCTIONAL = frozenset(torch_functional.__all__) - {"pca_lowrank", "svd_lowrank"}

#: Argument types that reach beyond the tensors of a call.
_FOREIGN_TYPES = ("Storage", "Stream", "Future", "Capsule", "Event")

#: Names a string argument that is a file name has in aten schemas (``from_file``, ``save``).
_PATH_ARGUMENTS = frozenset({"filename", "file", "path", "f"})


def refusal(kind: str, op: str) -> str | None:
    """Why a rerun must not call the function ``kind.op`` names (one clause, such as "writes
    files"), or None when it computes. Depends on names only, so it is decided once per name."""
    return _refusal(kind, op)


@functools.lru_cache(maxsize=8192)
def _refusal(kind: str, op: str) -> str | None:
    name, _, overload = op.partition(".")
    if kind != "Aten" and overload:
        return "is not a plain name"
    if kind == "Tensor" and name in _OPERATOR_DUNDERS:
        return None
    if name.startswith("__"):
        return "is a dunder: not an op capture records as a computation"
    for pattern, reason in _FAMILIES:  # torch_npu's npu_set_* as well as torch's set_*
        if pattern.search(name) or pattern.search(name.removeprefix("npu_")):
            return reason
    if kind in ("NPU", "Npu") or name.startswith("npu_"):
        return None if name.startswith("npu_") else "is not a torch_npu op (npu_*)"
    if kind == "Aten":
        return _aten_refusal(name, overload or None)
    if name.startswith("_"):  # private: only as the binding of an aten op (torch._grouped_mm)
        return _aten_refusal(name, None, private=True)
    if kind == "Torch" and (name in _TORCH_FUNCTIONAL):
        return None
    if kind == "Functional" and _defined_in_functional(name):
        return None
    if kind == "Tensor" and (name in _TENSOR_CONVERSIONS or _is_tensor_property(name)):
        return None
    return _aten_refusal(name, None)


def _defined_in_functional(name: str) -> bool:
    """A Python function of torch.nn.functional (not a helper it imports)."""
    found = getattr(F, name, None)
    return inspect.isfunction(found) and found.__module__ == F.__name__


def _is_tensor_property(name: str) -> bool:
    """``x.T``, ``x.mT``, ``x.real``: reading a Tensor property computes nothing else."""
    return inspect.isdatadescriptor(getattr(torch.Tensor, name, None))


def _aten_refusal(name: str, overload: str | None, *, private: bool = False) -> str | None:
    """Why the aten operator (its named overload, or every overload) does not compute."""
    packet = _aten_packet(name)
    if packet is None:
        if private:
            return "is private and not an aten op: not a computation capture records"
        return "is not a computation in torch's operator registry (torch.ops.aten)"
    names = [overload] if overload is not None else list(packet.overloads())
    for each in names:
        try:
            schema = getattr(packet, each)._schema
        except (AttributeError, RuntimeError):
            if overload is not None:
                return f"has no aten overload {overload!r}"
            continue
        reason = _schema_refusal(schema)
        if reason is not None:
            return reason
    return None


def _aten_packet(name: str) -> Any:
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        return None
    try:
        packet = getattr(torch.ops.aten, name)
    except (AttributeError, RuntimeError):
        return None
    return packet if isinstance(packet, torch._ops.OpOverloadPacket) else None


def _schema_refusal(schema: Any) -> str | None:
    """Why one overload's schema is not a computation: it returns nothing and writes no tensor
    (it runs for a side effect: print, save, a global setting), takes a file name, a storage,
    stream or future, or a random generator (unless a training flag decides whether it draws:
    the rerun checks that flag). Writing its own tensor arguments is fine: the rerun owns them."""
    writes = any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)
    if not schema.returns and not writes:
        return "returns nothing: it runs for a side effect"
    names = {a.name for a in schema.arguments}
    for argument in schema.arguments:
        written = str(argument.type)
        if any(foreign in written for foreign in _FOREIGN_TYPES):
            return f"takes a {written}: it acts beyond its tensors"
        if "Generator" in written and "training" not in names and "train" not in names:
            return "draws from the random number generator state"
        if "str" in written and argument.name in _PATH_ARGUMENTS:
            return "reads or writes files"
        if argument.name == "unsafe":  # segment_reduce(unsafe=True) trusts its lengths
            return _UNCHECKED
    return None
