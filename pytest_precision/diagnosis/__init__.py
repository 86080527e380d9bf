"""Diagnosis: from "the answer changed" to the culprit op in one call (docs/diagnose.md).

``diagnose`` returns a ``Diagnosis`` (data); its HTML page is written when a renderer is passed
(``render=pytest_precision.report.render_html``; the CLI and ``assert_same_generation`` do).
``save_run`` keeps one side's generation for a diagnosis on another machine.
``check_batch_invariance`` / ``assert_batch_invariant`` judge a prompt alone against the same
prompt inside batches; ``check_scheduling_invariance`` / ``assert_scheduling_invariant`` the
same vLLM requests with prefix caching, chunked prefill or request order changed
(docs/batch-invariance.md). Names load on first use (torch).
"""

from __future__ import annotations

import typing

from .._lazy import exports

if typing.TYPE_CHECKING:
    from ._batch import (
        BatchCase,
        BatchInvariance,
        BatchVariant,
        assert_batch_invariant,
        check_batch_invariance,
    )
    from ._generation import save_run
    from ._results import Diagnosis
    from ._scheduling import (
        SchedulingCase,
        SchedulingInvariance,
        SchedulingVariant,
        assert_scheduling_invariant,
        check_scheduling_invariance,
    )
    from ._workflow import diagnose

#: Each public name and the module it lives in: the one list of this package's surface.
_MODULES = {
    "._batch": (
        "BatchCase",
        "BatchInvariance",
        "BatchVariant",
        "assert_batch_invariant",
        "check_batch_invariance",
    ),
    "._generation": ("save_run",),
    "._results": ("Diagnosis",),
    "._scheduling": (
        "SchedulingCase",
        "SchedulingInvariance",
        "SchedulingVariant",
        "assert_scheduling_invariant",
        "check_scheduling_invariance",
    ),
    "._workflow": ("diagnose",),
}

__all__, __getattr__, __dir__ = exports(globals(), _MODULES)
