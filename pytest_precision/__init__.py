"""pytest-precision: is this numerical difference noise or a bug, and where did it start?

The common names of every stage, re-exported from the stage namespaces
(``pytest_precision.numerics``, ``.golden``, ``.compare``, ``.output``, ...), which document and
export their own. Names are imported on first use (PEP 562), so ``import pytest_precision``
(which the pytest plugin does in every run) does not import torch.

One verb convention: ``compare_*`` / ``check_*`` (and ``detect_*``, ``pick_*``, ``diff_*``)
return a result and never raise on a finding; ``assert_*`` raise, with the same result on the
exception (an ``AssertionError``; output checks raise a subclass of ``OutputCheckFailed``).
``_MODULES`` below is the one list of public names: ``__all__`` and the lazy lookup derive from
it, and ``tests/architecture/test_public_api.py`` checks the ``TYPE_CHECKING`` imports repeat it.
"""

from __future__ import annotations

import typing

from . import _lazy
from ._version import __version__

if typing.TYPE_CHECKING:
    from ._errors import DumpFormatError, PrecisionError, PrecisionInputError, PrecisionWarning
    from .compare import (
        Divergence,
        DumpComparison,
        RecordComparison,
        ShardedComparison,
        StatsComparison,
        UnmatchedCall,
        compare_dumps,
    )
    from .diagnosis import (
        BatchCase,
        BatchInvariance,
        BatchVariant,
        Diagnosis,
        SchedulingCase,
        SchedulingInvariance,
        SchedulingVariant,
        assert_batch_invariant,
        assert_scheduling_invariant,
        check_batch_invariance,
        check_scheduling_invariance,
        diagnose,
        save_run,
    )
    from .dump import Dump, Record, capture, load_dump
    from .golden import (
        Golden,
        assert_close_to_golden,
        assert_layers_close_to_golden,
        float64_reference,
    )
    from .integrations import capture_vllm
    from .numerics import (
        AllClose,
        Comparison,
        Exact,
        ModelLevel,
        PrecisionChecker,
        Ratio,
        RatioTier,
        Reference,
        ReferenceLimit,
        Spread,
        Standard,
        TensorComparison,
        TensorStats,
        Ulp,
        UlpLimit,
        assert_close,
        compare_tensors,
        default_standard,
        tensor_stats,
    )
    from .output import (
        BadCases,
        BadCasesFound,
        ChecklistDiffers,
        LogitsComparison,
        LogitsDiffer,
        OutputCheckFailed,
        ScoreCheck,
        ScoreOutOfTolerance,
        Symptom,
        SymptomsFound,
        TokenComparison,
        TokenDivergence,
        TokensDiverged,
        WeightsNotLoaded,
        WeightsReport,
        assert_logits_close,
        assert_no_badcases,
        assert_no_jitter,
        assert_no_symptoms,
        assert_same_config,
        assert_same_environment,
        assert_score_within,
        assert_tokens_close,
        assert_weights_loaded,
        check_scores,
        check_weights_loaded,
        compare_logits,
        compare_tokens,
        detect_garbled,
        detect_jitter,
        detect_repetition,
        detect_symptoms,
        diff_configs,
        fingerprint_weights,
        first_divergent_token,
        pick_badcases,
    )
    from .plugin._generation import GenerationDiffers, assert_same_generation
    from .replay import ReplayResult, replay_op
    from .report import render
    from .runtime import (
        ChecklistDiff,
        DeterminismWarning,
        SeedHandle,
        assert_deterministic,
        diff_environment,
        precision_environment,
        seed_all,
    )

_MODULES = {
    "._errors": (
        "DumpFormatError",
        "PrecisionError",
        "PrecisionInputError",
        "PrecisionWarning",
    ),
    ".compare": (
        "Divergence",
        "DumpComparison",
        "RecordComparison",
        "ShardedComparison",
        "StatsComparison",
        "UnmatchedCall",
        "compare_dumps",
    ),
    ".diagnosis": (
        "BatchCase",
        "BatchInvariance",
        "BatchVariant",
        "Diagnosis",
        "SchedulingCase",
        "SchedulingInvariance",
        "SchedulingVariant",
        "assert_batch_invariant",
        "assert_scheduling_invariant",
        "check_batch_invariance",
        "check_scheduling_invariance",
        "diagnose",
        "save_run",
    ),
    ".dump": (
        "Dump",
        "Record",
        "capture",
        "load_dump",
    ),
    ".golden": (
        "Golden",
        "assert_close_to_golden",
        "assert_layers_close_to_golden",
        "float64_reference",
    ),
    ".integrations": ("capture_vllm",),
    ".numerics": (
        "AllClose",
        "Comparison",
        "Exact",
        "ModelLevel",
        "PrecisionChecker",
        "Ratio",
        "RatioTier",
        "Reference",
        "ReferenceLimit",
        "Spread",
        "Standard",
        "TensorComparison",
        "TensorStats",
        "Ulp",
        "UlpLimit",
        "assert_close",
        "compare_tensors",
        "default_standard",
        "tensor_stats",
    ),
    ".output": (
        "BadCases",
        "BadCasesFound",
        "ChecklistDiffers",
        "LogitsComparison",
        "LogitsDiffer",
        "OutputCheckFailed",
        "ScoreCheck",
        "ScoreOutOfTolerance",
        "Symptom",
        "SymptomsFound",
        "TokenComparison",
        "TokenDivergence",
        "TokensDiverged",
        "WeightsNotLoaded",
        "WeightsReport",
        "assert_logits_close",
        "assert_no_badcases",
        "assert_no_jitter",
        "assert_no_symptoms",
        "assert_same_config",
        "assert_same_environment",
        "assert_score_within",
        "assert_tokens_close",
        "assert_weights_loaded",
        "check_scores",
        "check_weights_loaded",
        "compare_logits",
        "compare_tokens",
        "detect_garbled",
        "detect_jitter",
        "detect_repetition",
        "detect_symptoms",
        "diff_configs",
        "first_divergent_token",
        "fingerprint_weights",
        "pick_badcases",
    ),
    ".plugin._generation": (
        "GenerationDiffers",
        "assert_same_generation",
    ),
    ".report": ("render",),
    ".replay": (
        "ReplayResult",
        "replay_op",
    ),
    ".runtime": (
        "ChecklistDiff",
        "DeterminismWarning",
        "SeedHandle",
        "assert_deterministic",
        "diff_environment",
        "precision_environment",
        "seed_all",
    ),
}

__all__, __getattr__, __dir__ = _lazy.exports(globals(), _MODULES, "__version__")
