"""Numerics: how far apart two tensors are, and whether that is within a standard.

The lowest stage: float64 metrics over flat chunks (on the tensor's own device), the standards
(allclose, ratio, ulp, reference, exact, precision_checker) that turn metrics into a verdict,
``compare_tensors`` (a result) and ``assert_close`` (raises). Names load on first use (torch).
"""

from __future__ import annotations

import typing

from .._lazy import exports

if typing.TYPE_CHECKING:
    from ._assertions import Comparison, assert_close
    from ._comparison import TensorComparison, compare_tensors, default_standard
    from ._envelopes import ModelLevel, Spread
    from ._precision_checker import PrecisionChecker
    from ._standards import (
        AllClose,
        Exact,
        Ratio,
        RatioTier,
        Reference,
        ReferenceLimit,
        Standard,
        Ulp,
        UlpLimit,
    )
    from ._stats import TensorStats, tensor_stats

#: Each public name and the module it lives in: the one list of this package's surface.
_MODULES = {
    "._assertions": (
        "Comparison",
        "assert_close",
    ),
    "._comparison": (
        "TensorComparison",
        "compare_tensors",
        "default_standard",
    ),
    "._envelopes": (
        "ModelLevel",
        "Spread",
    ),
    "._precision_checker": ("PrecisionChecker",),
    "._standards": (
        "AllClose",
        "Exact",
        "Ratio",
        "RatioTier",
        "Reference",
        "ReferenceLimit",
        "Standard",
        "Ulp",
        "UlpLimit",
    ),
    "._stats": (
        "TensorStats",
        "tensor_stats",
    ),
}

__all__, __getattr__, __dir__ = exports(globals(), _MODULES)
