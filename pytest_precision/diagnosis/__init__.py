"""Diagnosis: from "the answer changed" to the culprit op in one call (docs/diagnose.md).

``save_run`` keeps one side's generation for a diagnosis on another machine; the workflow
returns a ``Diagnosis`` (data; its HTML page is rendered by ``report``). Names load on first use.
"""

from __future__ import annotations

import typing

from .._lazy import exports

if typing.TYPE_CHECKING:
    from ._generation import save_run
    from ._results import Diagnosis

#: Each public name and the module it lives in: the one list of this package's surface.
_MODULES = {
    "._generation": ("save_run",),
    "._results": ("Diagnosis",),
}

__all__, __getattr__, __dir__ = exports(globals(), _MODULES)
