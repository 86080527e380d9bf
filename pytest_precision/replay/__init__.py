"""Replay: one recorded op call run again on a device, and whether the op itself is wrong.

``replay_op`` returns a ``ReplayResult`` whose verdict is ``op-bug``, ``context`` or ``noise``;
``_export`` writes a call as a standalone regression test. Names load on first use (torch).
"""

from __future__ import annotations

import typing

from .._lazy import exports

if typing.TYPE_CHECKING:
    from ._verdict import ReplayResult, replay_op

#: Each public name and the module it lives in: the one list of this package's surface.
_MODULES = {
    "._verdict": (
        "ReplayResult",
        "replay_op",
    ),
}

__all__, __getattr__, __dir__ = exports(globals(), _MODULES)
