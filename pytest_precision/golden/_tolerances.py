"""Tolerances a golden check uses: from the call, the ``precision`` marker, or per dtype from the
``precision_tolerances`` ini option."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from .._errors import PrecisionInputError
from ..numerics._comparison import resolve_standard
from ..numerics._standard_names import STANDARDS
from ..numerics._standards import Standard


@dataclass(frozen=True)
class Tolerance:
    """A standard and/or allclose tolerances; unset fields defer to the next level."""

    standard: str | Standard | None = None
    rtol: float | None = None
    atol: float | None = None

    @property
    def is_set(self) -> bool:
        return self.standard is not None or self.rtol is not None or self.atol is not None


#: No tolerance given: the standards' defaults apply.
NO_TOLERANCE = Tolerance()


def parse_tolerances(
    lines: Iterable[str], source: str = "precision_tolerances"
) -> dict[torch.dtype, Tolerance]:
    """Parse per-dtype tolerance lines such as ``bfloat16: rtol=1.6e-2 atol=1e-5`` or
    ``float32: standard=ulp``; every malformed line is a :class:`PrecisionInputError`."""
    table: dict[torch.dtype, Tolerance] = {}
    for number, raw in enumerate(lines, 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"{source} line {number} ({raw.strip()!r})"
        dtype_name, sep, settings = line.partition(":")
        dtype = getattr(torch, dtype_name.strip(), None)
        if not sep or not isinstance(dtype, torch.dtype):
            raise PrecisionInputError(
                f"{where}: expected 'DTYPE: key=value ...' with a torch dtype name such as "
                "bfloat16, float16, float32"
            )
        values: dict[str, Any] = {}
        for setting in settings.split():
            key, eq, value = setting.partition("=")
            if not eq or key not in ("standard", "rtol", "atol"):
                raise PrecisionInputError(
                    f"{where}: {setting!r} is not standard=NAME, rtol=NUMBER or atol=NUMBER"
                )
            if key == "standard":
                if value not in STANDARDS:
                    raise PrecisionInputError(
                        f"{where}: unknown standard {value!r} (known: {', '.join(STANDARDS)})"
                    )
                values[key] = value
                continue
            try:
                number_value = float(value)
            except ValueError:
                raise PrecisionInputError(
                    f"{where}: {key} must be a number, not {value!r}"
                ) from None
            if not number_value >= 0:
                raise PrecisionInputError(f"{where}: {key} must be >= 0")
            values[key] = number_value
        if not values:
            raise PrecisionInputError(f"{where}: no standard, rtol or atol given")
        if dtype in table:
            raise PrecisionInputError(f"{where}: {dtype_name.strip()} is configured twice")
        tolerance = Tolerance(**values)
        try:
            resolve_standard(tolerance.standard, dtype, rtol=tolerance.rtol, atol=tolerance.atol)
        except PrecisionInputError as exc:
            raise PrecisionInputError(f"{where}: {exc}") from None
        table[dtype] = tolerance
    return table
