"""The running test's golden, and the statuses a golden comparison's record carries.

What the goldens library (:mod:`._golden`) and the pytest plugin share. Apart from the library
because it needs no torch: the plugin activates a golden for every test and reads the records of
every report, whether or not any test uses goldens.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._golden import Golden

#: A record's status: a comparison verdict, or what happened instead of a comparison.
STATUSES = ("error", "missing", "fail", "warn", "rewritten", "recorded", "remeasured", "pass")
#: ``remeasured``: the value still matched and was kept, its noise envelope was measured anew.
UPDATED = ("recorded", "rewritten", "remeasured")

#: Factories of the running tests' goldens, innermost last (pytester nests runs). A plain list,
#: not a ContextVar, so threads started by a test see its golden too.
_ACTIVE: list[Callable[[], Golden] | None] = []


def activate(factory: Callable[[], Golden] | None) -> int:
    """Make ``factory`` build the golden used by ``assert_close_to_golden``; returns a token
    for :func:`deactivate`."""
    _ACTIVE.append(factory)
    return len(_ACTIVE) - 1


def deactivate(token: int) -> None:
    del _ACTIVE[token:]


def active_factory() -> Callable[[], Golden] | None:
    """What builds the innermost running test's golden; None outside a test."""
    return _ACTIVE[-1] if _ACTIVE else None
