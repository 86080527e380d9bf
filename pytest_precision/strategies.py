"""Hypothesis strategies for precision tests: tensors of every float dtype, shapes, ranges and
special values on demand, and a recorded call's inputs perturbed within their recorded range.

Needs hypothesis (``pip install hypothesis``; the ``test`` extra has it)::

    from hypothesis import given
    from pytest_precision import strategies as pst

    @given(pst.tensors(dtype=pst.float_dtypes(), shape=pst.shapes(max_dims=3)))
    def test_softmax_rows_sum_to_one(x): ...
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

try:
    import hypothesis.strategies as st
except ImportError as exc:  # pragma: no cover - exercised in a subprocess test
    raise ImportError(
        "pytest_precision.strategies needs hypothesis: pip install hypothesis (or install "
        "pytest-precision with the 'test' extra)"
    ) from exc

import torch

from ._errors import PrecisionInputError

if TYPE_CHECKING:
    from .dump._records import Dump

__all__ = [
    "FLOAT_DTYPES",
    "SPECIAL_VALUES",
    "float_dtypes",
    "perturbed_inputs",
    "shapes",
    "tensors",
]

#: Every floating dtype torch has here: the four compute dtypes and the float8 formats.
FLOAT_DTYPES: tuple[torch.dtype, ...] = tuple(
    d
    for d in (
        torch.float16,
        torch.bfloat16,
        torch.float32,
        torch.float64,
        getattr(torch, "float8_e4m3fn", None),
        getattr(torch, "float8_e5m2", None),
    )
    if d is not None
)
#: The special values ``tensors(special=...)`` can plant; ``True`` means all of them.
SPECIAL_VALUES = ("nan", "inf", "-inf", "-0.0", "max", "-max", "tiny", "subnormal")


def float_dtypes(*, float8: bool = False) -> st.SearchStrategy[torch.dtype]:
    """float16, bfloat16, float32, float64 (and the float8 formats with ``float8=True``)."""
    return st.sampled_from([d for d in FLOAT_DTYPES if float8 or d.itemsize > 1])


def shapes(
    *, min_dims: int = 0, max_dims: int = 4, min_side: int = 0, max_side: int = 8
) -> st.SearchStrategy[tuple[int, ...]]:
    """Tensor shapes: ``min_dims``..``max_dims`` axes of ``min_side``..``max_side`` each."""
    if not 0 <= min_dims <= max_dims or not 0 <= min_side <= max_side:
        raise PrecisionInputError(
            "shapes() needs 0 <= min_dims <= max_dims, 0 <= min_side <= max_side"
        )
    return st.lists(st.integers(min_side, max_side), min_size=min_dims, max_size=max_dims).map(
        tuple
    )


def _special(value: str, dtype: torch.dtype) -> float:
    info = torch.finfo(dtype)
    return {
        "nan": math.nan,
        "inf": math.inf,
        "-inf": -math.inf,
        "-0.0": -0.0,
        "max": float(info.max),
        "-max": -float(info.max),
        "tiny": float(info.tiny),
        "subnormal": float(info.smallest_normal) / 2,
    }[value]


@st.composite
def _tensor(
    draw: st.DrawFn,
    dtype: st.SearchStrategy[torch.dtype],
    shape: st.SearchStrategy[tuple[int, ...]],
    min_value: float,
    max_value: float,
    special: tuple[str, ...],
) -> torch.Tensor:
    chosen = draw(dtype)
    size = draw(shape)
    info = torch.finfo(chosen)
    low, high = max(min_value, -float(info.max)), min(max_value, float(info.max))
    n = math.prod(size)
    values = draw(
        st.lists(
            st.floats(low, high, allow_nan=False, allow_infinity=False), min_size=n, max_size=n
        )
    )
    if special and n:
        planted = draw(
            st.lists(st.tuples(st.integers(0, n - 1), st.sampled_from(special)), max_size=n)
        )
        for index, name in planted:
            values[index] = _special(name, chosen)
    return torch.tensor(values, dtype=torch.float64).reshape(size).to(chosen)


def tensors(
    *,
    dtype: torch.dtype | st.SearchStrategy[torch.dtype] | None = None,
    shape: Sequence[int] | st.SearchStrategy[tuple[int, ...]] | None = None,
    min_value: float = -1e3,
    max_value: float = 1e3,
    special: bool | Iterable[str] = False,
) -> st.SearchStrategy[torch.Tensor]:
    """CPU tensors of ``dtype`` (a dtype or a strategy; default: every float dtype but float8)
    and ``shape`` (default :func:`shapes`), finite values in ``[min_value, max_value]``
    (clipped to the dtype's range, then rounded to it). ``special``: plant special values
    (``True``: every name in :data:`SPECIAL_VALUES`, or an iterable of those names)."""
    if not min_value <= max_value:
        raise PrecisionInputError(f"min_value {min_value} is above max_value {max_value}")
    names = SPECIAL_VALUES if special is True else tuple(special or ())
    unknown = sorted(set(names) - set(SPECIAL_VALUES))
    if unknown:
        raise PrecisionInputError(
            f"unknown special value(s) {unknown}; choose from {', '.join(SPECIAL_VALUES)}"
        )
    dtypes = (
        float_dtypes()
        if dtype is None
        else (st.just(dtype) if isinstance(dtype, torch.dtype) else dtype)
    )
    if isinstance(dtype, torch.dtype) and not dtype.is_floating_point:
        raise PrecisionInputError(f"tensors() draws floating tensors, got {dtype}")
    sizes = (
        shapes()
        if shape is None
        else (st.just(tuple(shape)) if not isinstance(shape, st.SearchStrategy) else shape)
    )
    return _tensor(dtypes, sizes, float(min_value), float(max_value), names)


def perturbed_inputs(
    dump: Dump | str | os.PathLike[str],
    name: str,
    *,
    scale: float = 1e-2,
    step: int | None = None,
    rank: int | None = None,
) -> st.SearchStrategy[dict[str, torch.Tensor]]:
    """The floating tensor inputs of the recorded call ``name``, each moved by up to ``scale``
    of its recorded range (``max - min``) per element and kept inside that range, as
    ``{slot: tensor}``, for fuzzing a suspect op from a dump (tensor mode)::

        @given(pst.perturbed_inputs("dumps/npu", "Functional.softmax.1.forward"))
        def test_softmax_near_the_recorded_input(inputs):
            out = torch.softmax(inputs["input.0"], dim=-1) ...

    Non-float inputs are returned as recorded."""
    from .dump._load import as_dump
    from .rerun._recompute import find_call

    call = find_call(as_dump(dump), name, step=step, rank=rank)
    recorded: dict[str, torch.Tensor] = {}
    for record in call.inputs:
        if not record.is_tensor:
            continue
        tensor = record.load()
        if tensor is None:
            raise PrecisionInputError(
                f"{name}: {record.slot} has statistics only; perturbed_inputs needs a tensor "
                "dump (capture mode='tensor')"
            )
        recorded[record.slot] = tensor
    if not recorded:
        raise PrecisionInputError(f"{name}: the call has no tensor inputs to perturb")

    @st.composite
    def draw_inputs(draw: st.DrawFn) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        for slot, tensor in recorded.items():
            if not tensor.is_floating_point() or tensor.numel() == 0:
                out[slot] = tensor.clone()
                continue
            wide = tensor.double()
            finite = wide[torch.isfinite(wide)]
            low, high = (float(finite.min()), float(finite.max())) if finite.numel() else (0, 0)
            seed = draw(st.integers(0, 2**32 - 1))
            amount = draw(st.floats(0.0, scale))
            noise = torch.rand(wide.shape, generator=torch.Generator().manual_seed(seed))
            moved = wide + (noise.double() * 2 - 1) * amount * (high - low)
            moved = torch.where(torch.isfinite(wide), moved.clamp(low, high), wide)
            out[slot] = moved.to(tensor.dtype)
        return out

    return draw_inputs()
