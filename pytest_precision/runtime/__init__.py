"""Runtime: the machine a result was measured on, and holding it still.

Device backends (cpu / cuda / npu), per-test seeds, determinism (``seed_all``,
``assert_deterministic``) and the environment fingerprint a checklist diffs
(``precision_environment``, ``diff_environment``). Names load on first use (torch).
"""

from __future__ import annotations

import typing

from .._lazy import exports

if typing.TYPE_CHECKING:
    from ._determinism import DeterminismWarning, SeedHandle, assert_deterministic, seed_all
    from ._environment import ChecklistDiff, diff_environment, precision_environment

#: Each public name and the module it lives in: the one list of this package's surface.
_MODULES = {
    "._determinism": (
        "DeterminismWarning",
        "SeedHandle",
        "assert_deterministic",
        "seed_all",
    ),
    "._environment": (
        "ChecklistDiff",
        "diff_environment",
        "precision_environment",
    ),
}

__all__, __getattr__, __dir__ = exports(globals(), _MODULES)
