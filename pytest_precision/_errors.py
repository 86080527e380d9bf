"""The exceptions raised by pytest-precision.

Every error a user can cause derives from :class:`PrecisionError`, so callers can catch one type;
each message names the offending item (file, record, path in a nested structure) and the problem.
"""

from __future__ import annotations

import os


class PrecisionError(Exception):
    """Base class of every pytest-precision error."""


class PrecisionInputError(PrecisionError, TypeError):
    """A value handed to a comparison cannot be compared (wrong type, shape, device, ...)."""


class DumpFormatError(PrecisionError, ValueError):
    """A dump, golden or tensor file is malformed; the message names the file and the problem."""

    def __init__(self, path: str | os.PathLike[str], problem: str) -> None:
        self.path = os.fspath(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


class PrecisionWarning(UserWarning):
    """A comparison landed in a standard's ``warn`` tier: not a failure, but worth a look."""
