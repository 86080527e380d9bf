"""Guards the public surface: adding or removing a public name must be a deliberate change."""

from __future__ import annotations
import __future__

import types

import pytest_precision

EXPECTED = {
    "BatchCase",
    "BatchInvariance",
    "BatchVariant",
    "assert_batch_invariant",
    "check_batch_invariance",
    # diagnose (#14)
    "Diagnosis",
    "GenerationDiffers",
    "assert_same_generation",
    "diagnose",
    "save_run",
    "Divergence",
    "DumpComparison",
    "RecordComparison",
    "StatsComparison",
    "UnmatchedCall",
    "compare_dumps",
    "ReplayResult",
    "replay_op",
    "AllClose",
    "Comparison",
    "DeterminismWarning",
    "Dump",
    "DumpFormatError",
    "Exact",
    "Golden",
    "ModelLevel",
    "Spread",
    "assert_layers_close_to_golden",
    "float64_reference",
    "PrecisionChecker",
    "PrecisionError",
    "PrecisionInputError",
    "PrecisionWarning",
    "Ratio",
    "RatioTier",
    "Record",
    "Reference",
    "ReferenceLimit",
    "SeedHandle",
    "ShardedComparison",
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
    "capture_vllm",
    "compare_tensors",
    "default_standard",
    "load_dump",
    "seed_all",
    "tensor_stats",
    # output-level checks
    "OutputCheckFailed",
    "BadCases",
    "assert_no_badcases",
    "pick_badcases",
    "ChecklistDiff",
    "assert_same_config",
    "assert_same_environment",
    "diff_configs",
    "diff_environment",
    "precision_environment",
    "ScoreCheck",
    "assert_score_within",
    "check_scores",
    "Symptom",
    "assert_no_jitter",
    "assert_no_symptoms",
    "detect_garbled",
    "detect_jitter",
    "detect_repetition",
    "detect_symptoms",
    "TokenComparison",
    "TokenDivergence",
    "assert_tokens_close",
    "compare_tokens",
    "first_divergent_token",
    "LogitsComparison",
    "assert_logits_close",
    "compare_logits",
    "WeightsReport",
    "assert_weights_loaded",
    "check_weights_loaded",
    "fingerprint_weights",
}


def test_all_is_exactly_the_public_surface() -> None:
    assert set(pytest_precision.__all__) == EXPECTED


def test_every_public_name_resolves() -> None:
    for name in pytest_precision.__all__:
        assert getattr(pytest_precision, name) is not None, name


def test_no_undeclared_public_names() -> None:
    public = {
        name
        for name, value in vars(pytest_precision).items()
        if not name.startswith("_")
        and not isinstance(value, (types.ModuleType, __future__._Feature))
    }
    assert public <= set(pytest_precision.__all__)
