"""pytest-precision: is this numerical difference noise or a bug, and where did it start?

This module is the whole public surface; everything else lives in private modules. Names are
imported on first use (PEP 562), so ``import pytest_precision`` (which the pytest plugin does
in every run) does not import torch.
"""

from __future__ import annotations

import importlib
import typing

from ._version import __version__

if typing.TYPE_CHECKING:
    from ._errors import DumpFormatError, PrecisionError, PrecisionInputError, PrecisionWarning
    from .compare._dumps import compare_dumps
    from .compare._results import (
        Divergence,
        DumpComparison,
        RecordComparison,
        StatsComparison,
        UnmatchedCall,
    )
    from .dump import Dump, Record, capture, load_dump
    from .golden._assert import assert_close_to_golden
    from .golden._golden import Golden
    from .golden._layers import assert_layers_close_to_golden
    from .golden._reference import float64_reference
    from .numerics._assertions import Comparison, assert_close
    from .numerics._comparison import TensorComparison, compare_tensors, default_standard
    from .numerics._envelopes import ModelLevel, Spread
    from .numerics._standards import (
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
    from .numerics._stats import TensorStats, tensor_stats
    from .replay._verdict import ReplayResult, replay_op
    from .runtime._determinism import DeterminismWarning, SeedHandle, assert_deterministic, seed_all

__all__ = [
    "AllClose",
    "Comparison",
    "DeterminismWarning",
    "Divergence",
    "Dump",
    "DumpComparison",
    "DumpFormatError",
    "Exact",
    "Golden",
    "ModelLevel",
    "PrecisionError",
    "PrecisionInputError",
    "PrecisionWarning",
    "Ratio",
    "RatioTier",
    "Record",
    "RecordComparison",
    "Reference",
    "ReferenceLimit",
    "ReplayResult",
    "SeedHandle",
    "Spread",
    "Standard",
    "StatsComparison",
    "TensorComparison",
    "TensorStats",
    "Ulp",
    "UlpLimit",
    "UnmatchedCall",
    "__version__",
    "assert_close",
    "assert_close_to_golden",
    "assert_deterministic",
    "assert_layers_close_to_golden",
    "capture",
    "compare_dumps",
    "compare_tensors",
    "default_standard",
    "float64_reference",
    "load_dump",
    "replay_op",
    "seed_all",
    "tensor_stats",
]

#: Where each lazily imported public name lives (the TYPE_CHECKING imports above, as data).
_MODULES = {
    "._errors": ("DumpFormatError", "PrecisionError", "PrecisionInputError", "PrecisionWarning"),
    ".compare._dumps": ("compare_dumps",),
    ".compare._results": (
        "Divergence",
        "DumpComparison",
        "RecordComparison",
        "StatsComparison",
        "UnmatchedCall",
    ),
    ".dump": ("Dump", "Record", "capture", "load_dump"),
    ".golden._assert": ("assert_close_to_golden",),
    ".golden._golden": ("Golden",),
    ".golden._layers": ("assert_layers_close_to_golden",),
    ".golden._reference": ("float64_reference",),
    ".numerics._assertions": ("Comparison", "assert_close"),
    ".numerics._comparison": ("TensorComparison", "compare_tensors", "default_standard"),
    ".numerics._envelopes": ("ModelLevel", "Spread"),
    ".numerics._standards": (
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
    ".numerics._stats": ("TensorStats", "tensor_stats"),
    ".replay._verdict": ("ReplayResult", "replay_op"),
    ".runtime._determinism": (
        "DeterminismWarning",
        "SeedHandle",
        "assert_deterministic",
        "seed_all",
    ),
}
_MODULE_OF = {name: module for module, names in _MODULES.items() for name in names}


def __getattr__(name: str) -> typing.Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
