"""pytest-precision: is this numerical difference noise or a bug, and where did it start?

This module is the whole public surface; everything else lives in private modules. Names are
imported on first use (PEP 562), so ``import pytest_precision`` (which the pytest plugin does
in every run) does not import torch.
"""

from __future__ import annotations

import typing

from . import _lazy
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
    from .compare._shards import ShardedComparison
    from .diagnosis._batch import (
        BatchCase,
        BatchInvariance,
        BatchVariant,
        assert_batch_invariant,
        check_batch_invariance,
    )
    from .diagnosis._generation import save_run
    from .diagnosis._results import Diagnosis
    from .dump import Dump, Record, capture, load_dump
    from .golden._assert import assert_close_to_golden
    from .golden._golden import Golden
    from .golden._layers import assert_layers_close_to_golden
    from .golden._reference import float64_reference
    from .integrations._vllm import capture_vllm
    from .numerics._assertions import Comparison, assert_close
    from .numerics._comparison import TensorComparison, compare_tensors, default_standard
    from .numerics._envelopes import ModelLevel, Spread
    from .numerics._precision_checker import PrecisionChecker
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
    from .output._badcases import BadCases, assert_no_badcases, pick_badcases
    from .output._checklist import assert_same_config, assert_same_environment, diff_configs
    from .output._common import OutputCheckFailed
    from .output._logits import LogitsComparison, assert_logits_close, compare_logits
    from .output._scores import ScoreCheck, assert_score_within, check_scores
    from .output._symptoms import (
        Symptom,
        assert_no_jitter,
        assert_no_symptoms,
        detect_garbled,
        detect_jitter,
        detect_repetition,
        detect_symptoms,
    )
    from .output._tokens import (
        TokenComparison,
        TokenDivergence,
        assert_tokens_close,
        compare_tokens,
        first_divergent_token,
    )
    from .output._weights import (
        WeightsReport,
        assert_weights_loaded,
        check_weights_loaded,
        fingerprint_weights,
    )
    from .plugin._generation import GenerationDiffers, assert_same_generation, diagnose
    from .replay._verdict import ReplayResult, replay_op
    from .runtime._determinism import DeterminismWarning, SeedHandle, assert_deterministic, seed_all
    from .runtime._environment import ChecklistDiff, diff_environment, precision_environment

__all__ = [
    "AllClose",
    "BadCases",
    "BatchCase",
    "BatchInvariance",
    "BatchVariant",
    "ChecklistDiff",
    "Comparison",
    "DeterminismWarning",
    "Diagnosis",
    "Divergence",
    "Dump",
    "DumpComparison",
    "DumpFormatError",
    "Exact",
    "GenerationDiffers",
    "Golden",
    "LogitsComparison",
    "ModelLevel",
    "OutputCheckFailed",
    "PrecisionChecker",
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
    "ScoreCheck",
    "SeedHandle",
    "ShardedComparison",
    "Spread",
    "Standard",
    "StatsComparison",
    "Symptom",
    "TensorComparison",
    "TensorStats",
    "TokenComparison",
    "TokenDivergence",
    "Ulp",
    "UlpLimit",
    "UnmatchedCall",
    "WeightsReport",
    "__version__",
    "assert_batch_invariant",
    "assert_close",
    "assert_close_to_golden",
    "assert_deterministic",
    "assert_layers_close_to_golden",
    "assert_logits_close",
    "assert_no_badcases",
    "assert_no_jitter",
    "assert_no_symptoms",
    "assert_same_config",
    "assert_same_environment",
    "assert_same_generation",
    "assert_score_within",
    "assert_tokens_close",
    "assert_weights_loaded",
    "capture",
    "capture_vllm",
    "check_batch_invariance",
    "check_scores",
    "check_weights_loaded",
    "compare_dumps",
    "compare_logits",
    "compare_tensors",
    "compare_tokens",
    "default_standard",
    "detect_garbled",
    "detect_jitter",
    "detect_repetition",
    "detect_symptoms",
    "diagnose",
    "diff_configs",
    "diff_environment",
    "fingerprint_weights",
    "first_divergent_token",
    "float64_reference",
    "load_dump",
    "pick_badcases",
    "precision_environment",
    "replay_op",
    "save_run",
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
    ".compare._shards": ("ShardedComparison",),
    ".diagnosis._generation": ("save_run",),
    ".diagnosis._results": ("Diagnosis",),
    ".dump": ("Dump", "Record", "capture", "load_dump"),
    ".golden._assert": ("assert_close_to_golden",),
    ".golden._golden": ("Golden",),
    ".golden._layers": ("assert_layers_close_to_golden",),
    ".golden._reference": ("float64_reference",),
    ".integrations._vllm": ("capture_vllm",),
    ".numerics._assertions": ("Comparison", "assert_close"),
    ".numerics._comparison": ("TensorComparison", "compare_tensors", "default_standard"),
    ".numerics._envelopes": ("ModelLevel", "Spread"),
    ".numerics._precision_checker": ("PrecisionChecker",),
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
    ".output._badcases": ("BadCases", "assert_no_badcases", "pick_badcases"),
    ".output._checklist": ("assert_same_config", "assert_same_environment", "diff_configs"),
    ".output._common": ("OutputCheckFailed",),
    ".output._logits": ("LogitsComparison", "assert_logits_close", "compare_logits"),
    ".output._scores": ("ScoreCheck", "assert_score_within", "check_scores"),
    ".output._symptoms": (
        "Symptom",
        "assert_no_jitter",
        "assert_no_symptoms",
        "detect_garbled",
        "detect_jitter",
        "detect_repetition",
        "detect_symptoms",
    ),
    ".output._tokens": (
        "TokenComparison",
        "TokenDivergence",
        "assert_tokens_close",
        "compare_tokens",
        "first_divergent_token",
    ),
    ".output._weights": (
        "WeightsReport",
        "assert_weights_loaded",
        "check_weights_loaded",
        "fingerprint_weights",
    ),
    ".diagnosis._batch": (
        "BatchCase",
        "BatchInvariance",
        "BatchVariant",
        "assert_batch_invariant",
        "check_batch_invariance",
    ),
    ".plugin._generation": ("GenerationDiffers", "assert_same_generation", "diagnose"),
    ".replay._verdict": ("ReplayResult", "replay_op"),
    ".runtime._determinism": (
        "DeterminismWarning",
        "SeedHandle",
        "assert_deterministic",
        "seed_all",
    ),
    ".runtime._environment": ("ChecklistDiff", "diff_environment", "precision_environment"),
}
_MODULE_OF = {name: module for module, names in _MODULES.items() for name in names}


__getattr__ = _lazy.lazy_getattr(globals(), _MODULE_OF)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
