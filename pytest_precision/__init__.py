"""pytest-precision: is this numerical difference noise or a bug, and where did it start?

This module is the whole public surface; everything else lives in private modules.
"""

from __future__ import annotations

from ._assertions import Comparison, assert_close
from ._determinism import DeterminismWarning, SeedHandle, assert_deterministic, seed_all
from ._errors import DumpFormatError, PrecisionError, PrecisionInputError, PrecisionWarning
from ._golden import Golden, assert_close_to_golden
from ._metrics import TensorStats, tensor_stats
from ._standards import (
    AllClose,
    Exact,
    Ratio,
    RatioTier,
    Reference,
    ReferenceLimit,
    Standard,
    TensorComparison,
    Ulp,
    UlpLimit,
    compare_tensors,
    default_standard,
)
from ._version import __version__
from .dump import Dump, Record, capture, load_dump

__all__ = [
    "AllClose",
    "Comparison",
    "DeterminismWarning",
    "Dump",
    "DumpFormatError",
    "Exact",
    "Golden",
    "PrecisionError",
    "PrecisionInputError",
    "PrecisionWarning",
    "Ratio",
    "RatioTier",
    "Record",
    "Reference",
    "ReferenceLimit",
    "SeedHandle",
    "Standard",
    "TensorComparison",
    "TensorStats",
    "Ulp",
    "UlpLimit",
    "__version__",
    "assert_close",
    "assert_close_to_golden",
    "assert_deterministic",
    "capture",
    "compare_tensors",
    "default_standard",
    "load_dump",
    "seed_all",
    "tensor_stats",
]
