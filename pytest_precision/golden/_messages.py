"""What a failing golden says: the mismatch lines and the command that (re-)records it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .._errors import DumpFormatError
from ..numerics._assertions import Comparison
from ._envelope import describe
from ._files import NewerSchemaError
from ._sources import GoldenSource

_SUGGEST_ENVELOPE = (
    "if this value came out of many ops, re-record it (--golden-update reruns the test in "
    "float64 and stores the reference), or pass reference=... or envelope='model' "
    "(docs/standards.md)"
)


def mismatch_lines(
    test_id: str,
    where: str,
    name: str,
    comparison: Comparison,
    envelope: Mapping[str, Any] | None,
    excess: float | None,
    *,
    first_after: Sequence[str],
    suggest_envelope: bool,
    environment: Sequence[str],
    left_out: str = "",
) -> list[str]:
    """The message of a golden outside its tolerance, without the re-record hint.

    ``first_after``: the goldens of the test that passed before this first failing one;
    ``left_out``: what the mask left out, appended to the comparison's line."""
    lines = [f"{test_id}: golden mismatch (golden: {where})"]
    if excess is not None:
        lines.append(
            f"{name}: {excess:.3g}x the limit of {describe(envelope)} "
            f"({100 * (excess - 1):.3g} % beyond it)"
        )
    lines.append(comparison.message() + left_out)
    if first_after:
        lines.append(f"first failing golden of this test: {name} ({', '.join(first_after)} passed)")
    if suggest_envelope:
        lines.append(_SUGGEST_ENVELOPE)
    if environment:
        lines += ["environment differs from the run that recorded the golden:", *environment]
    return lines


def record_hint(what: str, source: GoldenSource, test_id: str, command: str | None) -> str:
    """How to record (``what``) the golden: the plugin's command line, or the library call."""
    if not source.writable:  # a dump: --golden-update would be refused
        return (
            f"the golden is a dump ({source.path}), which is read-only: if the change "
            "is intended, capture the baseline dump again on the reference machine, or "
            "record a golden directory with --golden-dir DIR --golden-update"
            if "re-record" in what
            else f"{what} in a golden directory (--golden-dir DIR --golden-update); a "
            f"dump ({source.path}) is read-only"
        )
    command = command or f"Golden({str(source.path)!r}, {test_id!r}, update=True)(value, name)"
    return f"{what} with:\n  {command}"


def unreadable_error(error: DumpFormatError, hint: str) -> DumpFormatError:
    """The failure of a golden that could not be read: the file, the problem and ``hint`` (the
    command that re-records it), raised without the reader's frames so that the failure is
    the test's line and this message. A file of a newer schema keeps its own message:
    re-recording it would lose it."""
    if not isinstance(error, NewerSchemaError):
        error = DumpFormatError(error.path, f"{error.problem}\n{hint}")
    return error.with_traceback(None)
