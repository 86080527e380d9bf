"""Dtype facts the metrics, standards and dump readers share: float formats, which of two dtypes
rounds coarser, and the one spelling of a dtype's name."""

from __future__ import annotations

import torch

from .._errors import PrecisionError

#: (precision in bits including the implicit one, minimum normal exponent) per float dtype.
FLOAT_FORMATS: dict[torch.dtype, tuple[int, int]] = {
    torch.float64: (53, -1022),
    torch.float32: (24, -126),
    torch.float16: (11, -14),
    torch.bfloat16: (8, -126),
}
#: The float8 formats this torch build has (older builds lack some).
FLOAT_FORMATS.update(
    {
        getattr(torch, name): fmt
        for name, fmt in {
            "float8_e4m3fn": (4, -6),
            "float8_e4m3fnuz": (4, -7),
            "float8_e5m2": (3, -14),
            "float8_e5m2fnuz": (3, -15),
        }.items()
        if hasattr(torch, name)
    }
)


def precision_bits(dtype: torch.dtype) -> int:
    """Significand bits (with the implicit bit) of a float dtype; 53 for integers and bools."""
    return FLOAT_FORMATS.get(dtype, FLOAT_FORMATS[torch.float64])[0]


def lower_precision(a: torch.dtype, b: torch.dtype) -> torch.dtype:
    """The dtype with fewer significand bits (the one whose rounding dominates)."""
    return a if precision_bits(a) <= precision_bits(b) else b


def dtype_from_name(name: str | None) -> torch.dtype:
    dtype = getattr(torch, name or "", None)
    if not isinstance(dtype, torch.dtype):
        raise PrecisionError(f"unknown dtype {name!r} in a dump record")
    return dtype


def dtype_name(dtype: torch.dtype | None) -> str:
    """``torch.bfloat16`` -> ``bfloat16``: the spelling records use."""
    return str(dtype).removeprefix("torch.")
