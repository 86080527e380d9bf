"""pytest-precision: is this numerical difference noise or a bug, and where did it start?

This module is the whole public surface; everything else lives in private modules.
"""

from __future__ import annotations

from ._determinism import DeterminismWarning, SeedHandle, assert_deterministic, seed_all
from ._errors import DumpFormatError, PrecisionError, PrecisionInputError
from ._metrics import TensorStats, tensor_stats
from ._version import __version__
from .dump import Dump, Record

__all__ = [
    "DeterminismWarning",
    "Dump",
    "DumpFormatError",
    "PrecisionError",
    "PrecisionInputError",
    "Record",
    "SeedHandle",
    "TensorStats",
    "__version__",
    "assert_deterministic",
    "seed_all",
    "tensor_stats",
]
