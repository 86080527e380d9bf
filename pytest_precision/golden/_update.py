"""What a golden check found, and what ``--golden-update`` does with it instead of failing."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..numerics._assertions import Comparison
from ._files import Entry, NewerSchemaError
from ._store import MISSING


@dataclass
class Found:
    """What the golden of a name is: where it was looked up, its value and stored entry, or
    the problem that stands for a comparison (no golden, unreadable file, other shape)."""

    where: str
    expected: Any = MISSING
    entry: Entry | None = None
    problem: str | None = None  # "missing", "unreadable" or "mismatch"
    error: Exception | None = None
    envelope: Mapping[str, Any] | None = None  # the envelope the check used

    @property
    def has_envelope(self) -> bool:
        return self.entry is not None and self.entry.envelope is not None


def update_action(
    found: Found, comparison: Comparison | None, *, remeasure: bool
) -> tuple[str, str] | None:
    """``(status, message)`` of what an update stages instead of failing, or None: check as
    usual. ``remeasured`` keeps the stored value and measures its envelope anew (``remeasure``:
    the call asked for an envelope, in a golden directory)."""
    if found.problem == "unreadable":
        if isinstance(found.error, NewerSchemaError):
            return None  # never rewrite a newer version's file: the test fails, asking to upgrade
        return "rewritten", f"was unreadable: {found.error}"
    if found.problem == "missing":
        return "recorded", "no golden yet"
    if found.problem == "mismatch":
        return "rewritten", str(found.error)
    if comparison is not None and not comparison.passed:
        return "rewritten", "differed"
    if remeasure:
        return "remeasured", "envelope re-measured"
    return None
