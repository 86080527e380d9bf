"""Output checks: what a model produced (tokens, logits, scores, text), judged as a user sees it.

Each check comes in two forms: ``compare_*`` / ``check_*`` / ``detect_*`` / ``pick_*`` /
``diff_*`` return a result and never raise on a finding; ``assert_*`` raise that result inside
an exception (a subclass of ``OutputCheckFailed``, with the result at ``.result``).
See docs/output-checks.md. Names load on first use (torch, numpy).
"""

from __future__ import annotations

import typing

from .._lazy import exports

if typing.TYPE_CHECKING:
    from ._badcases import BadCases, BadCasesFound, assert_no_badcases, pick_badcases
    from ._checklist import (
        ChecklistDiffers,
        assert_same_config,
        assert_same_environment,
        diff_configs,
    )
    from ._common import OutputCheckFailed
    from ._logits import LogitsComparison, LogitsDiffer, assert_logits_close, compare_logits
    from ._scores import ScoreCheck, ScoreOutOfTolerance, assert_score_within, check_scores
    from ._symptoms import (
        Symptom,
        SymptomsFound,
        assert_no_jitter,
        assert_no_symptoms,
        detect_garbled,
        detect_jitter,
        detect_repetition,
        detect_symptoms,
    )
    from ._tokens import (
        TokenComparison,
        TokenDivergence,
        TokensDiverged,
        assert_tokens_close,
        compare_tokens,
        first_divergent_token,
    )
    from ._weights import (
        WeightsNotLoaded,
        WeightsReport,
        assert_weights_loaded,
        check_weights_loaded,
        fingerprint_weights,
    )

#: Each public name and the module it lives in: the one list of this package's surface.
_MODULES = {
    "._badcases": (
        "BadCases",
        "BadCasesFound",
        "assert_no_badcases",
        "pick_badcases",
    ),
    "._checklist": (
        "ChecklistDiffers",
        "assert_same_config",
        "assert_same_environment",
        "diff_configs",
    ),
    "._common": ("OutputCheckFailed",),
    "._logits": (
        "LogitsComparison",
        "LogitsDiffer",
        "assert_logits_close",
        "compare_logits",
    ),
    "._scores": (
        "ScoreCheck",
        "ScoreOutOfTolerance",
        "assert_score_within",
        "check_scores",
    ),
    "._symptoms": (
        "Symptom",
        "SymptomsFound",
        "assert_no_jitter",
        "assert_no_symptoms",
        "detect_garbled",
        "detect_jitter",
        "detect_repetition",
        "detect_symptoms",
    ),
    "._tokens": (
        "TokenComparison",
        "TokenDivergence",
        "TokensDiverged",
        "assert_tokens_close",
        "compare_tokens",
        "first_divergent_token",
    ),
    "._weights": (
        "WeightsNotLoaded",
        "WeightsReport",
        "assert_weights_loaded",
        "check_weights_loaded",
        "fingerprint_weights",
    ),
}

__all__, __getattr__, __dir__ = exports(globals(), _MODULES)
