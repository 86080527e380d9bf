"""``float64_mode``: run a test body again with every rounding floating op computed in float64.

The float64 reference of a golden must be the *same computation* on the *same data*: the same
weights and inputs, bit for bit, with only the roundings of the computation taken away. So the
mode changes computation, never data:

- an op that reads a low-precision float (bf16, fp16, float8) or a value the mode already
  deepened runs on float64 copies of its floating inputs (module parameters reach ``F.linear``
  and friends as arguments, so they are upcast too) and its floating ``dtype=`` argument becomes
  float64; its floating outputs are *deepened* (marked);
- a cast of a deepened value to any floating dtype (``.to(torch.bfloat16)``, ``.half()``,
  ``.float()``, ``.type(...)``, ``.type_as(...)``) is an identity: it keeps float64;
- everything else runs as written: creation ops (``torch.randn(..., dtype=torch.bfloat16)``
  draws the same numbers as in the normal run), casts of data that was never rounded by the
  computation (``torch.randn(4, 8).to(torch.bfloat16)``, ``model.to(torch.bfloat16)``: the
  golden's inputs and weights are these rounded values, so the reference's are too), integer
  ops, float32-only computation (it is the same in both runs), views and copies of data that is
  not deepened (exact, and in-place writes through them keep reaching the original), and
  in-place ops on a tensor that is not deepened (it keeps its dtype: a KV cache allocated in
  bf16 holds bf16 in the rerun too).

Under autocast a float32 input counts as low-precision (autocast would round it), and deepened
ops run with autocast off.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_map

#: Attribute set on the tensors the mode deepened (their values carry no rounding of the dtype
#: the normal run computed in).
_MARK = "_pytest_precision_float64"
_LOW = (torch.float16, torch.bfloat16)

#: Casts: with a deepened ``self`` and a floating target, the value stays float64.
_CASTS = frozenset({"to", "type", "type_as", "half", "bfloat16", "float", "double"})
#: Exact ops that alias or copy: on data that is not deepened they run as written, so writes
#: through a view reach the original and nothing is converted needlessly.
_EXACT = frozenset(
    {
        "__getitem__", "view", "view_as", "reshape", "reshape_as", "narrow", "select",
        "transpose", "t", "permute", "expand", "expand_as", "unsqueeze", "squeeze", "flatten",
        "unflatten", "split", "chunk", "unbind", "as_strided", "movedim", "diagonal",
        "detach", "clone", "contiguous", "cpu", "cuda", "requires_grad_", "__setitem__",
    }
)  # fmt: skip
#: Metadata and conversions to Python: never worth a conversion.
_METADATA = frozenset(
    {
        "__get__", "__set__", "size", "dim", "numel", "stride", "is_floating_point",
        "is_complex", "element_size", "data_ptr", "storage_offset", "is_contiguous",
        "nelement", "ndimension", "__len__", "untyped_storage", "get_device", "__repr__",
        "__format__", "__bool__", "item", "tolist", "__float__", "__int__", "__index__",
        "register_hook", "retain_grad", "backward", "numpy", "__array__",
    }
)  # fmt: skip
_RANDOM_LIKE = frozenset({"rand_like", "randn_like", "randint_like"})


def is_deepened(value: Any) -> bool:
    """Whether the mode computed ``value`` in float64 from data of lower precision."""
    return isinstance(value, torch.Tensor) and getattr(value, _MARK, False)


def _mark(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.dtype == torch.float64:
        with suppress(AttributeError, RuntimeError):  # a tensor type without a __dict__
            setattr(value, _MARK, True)
    return value


def _autocasting() -> bool:
    return any(torch.is_autocast_enabled(device) for device in ("cpu", "cuda"))


def _rounds_in_low_precision(t: torch.Tensor, autocast: bool) -> bool:
    return t.dtype in _LOW or (autocast and t.dtype == torch.float32) or t.dtype.itemsize == 1


def _upcast(value: Any) -> Any:
    if (
        isinstance(value, torch.Tensor)
        and value.is_floating_point()
        and value.dtype != torch.float64
    ):
        return value.to(torch.float64)
    return value


def _float64_dtype(value: Any) -> Any:
    return torch.float64 if isinstance(value, torch.dtype) and value.is_floating_point else value


class Float64Mode(TorchFunctionMode):
    """The torch function mode of :func:`float64_mode`; counts the ops it deepened."""

    def __init__(self) -> None:
        super().__init__()
        self.deepened_ops = 0

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in _METADATA:
            return func(*args, **kwargs)
        tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        floating = [t for t in tensors if t.is_floating_point()]
        deepened = any(is_deepened(t) for t in floating)
        if name in _CASTS and args and isinstance(args[0], torch.Tensor):
            return self._cast(func, name, args, kwargs, deepened=is_deepened(args[0]))
        if not floating:
            return func(*args, **kwargs)
        autocast = _autocasting()
        low = deepened or any(_rounds_in_low_precision(t, autocast) for t in floating)
        in_place = (name.endswith("_") and not name.startswith("__")) or "out" in kwargs
        in_place = in_place or name.startswith("__i")
        if not low or (name in _EXACT and not deepened):
            return func(*args, **kwargs)
        if (in_place or name == "__setitem__") and not is_deepened(args[0] if args else None):
            return func(*args, **kwargs)  # the target keeps its dtype, as in the normal run
        if name in _RANDOM_LIKE:
            return func(*args, **kwargs)
        self.deepened_ops += 1
        args, kwargs = tree_map(_upcast, (args, kwargs))
        kwargs = {k: _float64_dtype(v) if k == "dtype" else v for k, v in kwargs.items()}
        with torch.autocast("cpu", enabled=False) if autocast else _nothing():
            result = func(*args, **kwargs)
        return tree_map(_mark, result)

    def _cast(
        self,
        func: Callable[..., Any],
        name: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        deepened: bool,
    ) -> Any:
        if not deepened:
            return func(*args, **kwargs)  # data entering its dtype: rounded as in the normal run
        self_, rest = args[0], args[1:]
        if name in ("half", "bfloat16", "float", "double"):
            return self_
        if name == "type" and not rest and "dtype" not in kwargs:
            return func(*args, **kwargs)  # x.type(): the type's name
        if name == "type_as":
            other = rest[0] if rest else kwargs.get("other")
            return (
                self_
                if getattr(other, "is_floating_point", lambda: False)()
                else func(*args, **kwargs)
            )
        if name == "type":
            target = rest[0] if rest else kwargs.get("dtype")
            floating = (isinstance(target, torch.dtype) and target.is_floating_point) or (
                isinstance(target, str) and any(s in target for s in ("Float", "Half", "Double"))
            )
            return self_ if floating else func(*args, **kwargs)
        # Tensor.to(dtype), to(device, dtype), to(other), to(dtype=..., device=...)
        rest_list = list(rest)
        if rest_list and isinstance(rest_list[0], torch.Tensor):
            other = rest_list.pop(0)
            if not other.is_floating_point():
                return func(*args, **kwargs)
            kwargs = {**kwargs, "device": other.device, "dtype": torch.float64}
        rest_list = [_float64_dtype(a) for a in rest_list]
        kwargs = {k: _float64_dtype(v) if k == "dtype" else v for k, v in kwargs.items()}
        return _mark(func(self_, *rest_list, **kwargs))


@contextmanager
def _nothing() -> Iterator[None]:
    yield


@contextmanager
def float64_mode() -> Iterator[Float64Mode]:
    """Compute every rounding floating op inside the block in float64 (module docstring)."""
    with Float64Mode() as mode:
        yield mode
