"""Rerunning one recorded call: at the recorded dtypes or in float64, on a device, and judging an
output against what a correct op gives (:class:`Rerun`). What compare and replay both stand on:
given the inputs an op really received, what would it give in float64?"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Callable, Iterable
from typing import Any

import torch

from .._errors import PrecisionInputError
from ..dump._leaves import output_leaves
from ..dump._records import Call, Dump, Record
from ..numerics._comparison import TensorComparison, judge_rounding
from ..numerics._dtypes import dtype_from_name, dtype_name, lower_precision
from ._arguments import rebuild_arguments
from ._ops import _FLOAT_CASTS, NotReplayable, is_inplace, resolve_op


def lowest_float(records: Iterable[Record]) -> torch.dtype:
    """The floating dtype with the fewest significand bits among ``records`` (float64 if none)."""
    lowest = torch.float64
    for record in records:
        if record.dtype is not None:
            dtype = dtype_from_name(record.dtype)
            if dtype.is_floating_point:
                lowest = lower_precision(lowest, dtype)
    return lowest


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


def _kept(
    keep: Callable[[torch.Tensor], torch.Tensor | None],
    actual: torch.Tensor,
    exact: torch.Tensor,
    magnitude: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The judged part of an output, its reference and its terms' magnitude; all three whole
    when ``keep`` declines one of them."""
    kept_actual, kept_exact = keep(actual), keep(exact)
    kept_magnitude = None if magnitude is None else keep(magnitude)
    if (
        kept_actual is None
        or kept_exact is None
        or (magnitude is not None and kept_magnitude is None)
    ):
        return actual, exact, magnitude
    return kept_actual, kept_exact, kept_magnitude


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


#: Ops whose every output element is a sum of products of input elements (plus a bias): rerun
#: on the inputs' absolute values they give the magnitude of the terms each sum adds up.
# fmt: off
_CONTRACTIONS = frozenset({
    "linear", "matmul", "__matmul__", "__rmatmul__", "mm", "bmm", "addmm", "baddbmm", "addmv",
    "mv", "dot", "einsum", "sum", "mean",
})


# fmt: on
def is_contraction(call: Call) -> bool:
    """True for the linear contractions and sums whose rounding scales with their terms."""
    return call.kind in ("Functional", "Torch", "Tensor") and call.op in _CONTRACTIONS


def _magnitude_scalars(kwargs: dict[str, Any]) -> dict[str, Any]:
    """``addmm``'s ``alpha`` and ``beta`` by their absolute values (a negative one would make
    the terms cancel)."""
    return {
        key: abs(value) if key in ("alpha", "beta") and isinstance(value, float | int) else value
        for key, value in kwargs.items()
    }


def recompute(
    call: Call,
    *,
    dtype: torch.dtype | None = torch.float64,
    device: str | torch.device = "cpu",
    magnitude: bool = False,
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
        moved = tensor.to(device=target, dtype=new_dtype, copy=copy)
        return moved.abs() if magnitude and moved.is_floating_point() else moved

    if magnitude and not is_contraction(call):
        raise PrecisionInputError(f"{call.name}: the magnitude of terms needs a contraction")
    args, kwargs = rebuild_arguments(call, convert=convert)
    if magnitude:
        kwargs = _magnitude_scalars(kwargs)
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


class Rerun:
    """What a correct op gives for a recorded call, judged output by output: the float64 rerun
    for floats (within the rounding of the output's dtype; for a contraction also within the
    rounding of another accumulation order, scaled by the magnitude of its terms), the CPU
    rerun at the recorded dtypes for indices and masks (``x > 0.1`` compares with 0.1 rounded
    to the input's dtype, which the float64 rerun does not)."""

    def __init__(self, call: Call) -> None:
        self.call = call
        self.exact = recompute(call)
        self._same_dtypes: dict[str, torch.Tensor] | None = None
        self._magnitudes: dict[str, torch.Tensor] | None = None
        #: "slot: n element(s)" for each output whose float64 result overflows its dtype
        self.overflowed: list[str] = []

    def judge(
        self,
        slot: str,
        actual: torch.Tensor,
        *,
        saturate: bool = False,
        keep: Callable[[torch.Tensor], torch.Tensor | None] | None = None,
    ) -> TensorComparison | None:
        """``actual`` (a recorded or rerun output) against the reference; None where the call
        has no such output. ``saturate``: where the float64 result overflows the dtype, +-inf
        is right (IEEE rounding gives it). ``keep``: the part of the output that is judged (its
        real positions in a padded batch), applied alike to the output and the reference."""
        exact = self.exact.get(slot)
        if exact is None or tuple(exact.shape) != tuple(actual.shape):
            return None
        magnitude = None
        if actual.is_floating_point():
            if saturate:
                exact = self._saturated(slot, exact, actual.dtype)
            magnitude = self._magnitude(slot)
        elif not actual.is_complex():
            if self._same_dtypes is None:
                self._same_dtypes = recompute(self.call, dtype=None)
            exact = self._same_dtypes[slot]
        if keep is not None:
            actual, exact, magnitude = _kept(keep, actual, exact, magnitude)
        return judge_rounding(actual, exact, actual.dtype, magnitude=magnitude)

    def _magnitude(self, slot: str) -> torch.Tensor | None:
        """The magnitude of the terms each element of a contraction's output adds up (float64),
        which bounds how another accumulation order may round it; None for other ops."""
        if not is_contraction(self.call):
            return None
        if self._magnitudes is None:
            try:
                self._magnitudes = recompute(self.call, magnitude=True)
            except NotReplayable:
                self._magnitudes = {}
        return self._magnitudes.get(slot)

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
