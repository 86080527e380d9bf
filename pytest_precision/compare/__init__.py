"""Compare: two dumps of one model, aligned call by call, and the first call that went wrong.

``compare_dumps`` returns a ``DumpComparison`` (data; renderers in ``report`` take it), whose
``divergence`` names the culprit and its cause; ``ShardedComparison`` does the same for a run
split across ranks. The rules are in docs/compare.md. Names load on first use (torch).
"""

from __future__ import annotations

import typing

from .._lazy import exports

if typing.TYPE_CHECKING:
    from ._dumps import compare_dumps
    from ._results import (
        Divergence,
        DumpComparison,
        RecordComparison,
        StatsComparison,
        UnmatchedCall,
    )
    from ._shards import ShardedComparison

#: Each public name and the module it lives in: the one list of this package's surface.
_MODULES = {
    "._dumps": ("compare_dumps",),
    "._results": (
        "Divergence",
        "DumpComparison",
        "RecordComparison",
        "StatsComparison",
        "UnmatchedCall",
    ),
    "._shards": ("ShardedComparison",),
}

__all__, __getattr__, __dir__ = exports(globals(), _MODULES)
