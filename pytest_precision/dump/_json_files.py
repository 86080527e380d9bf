"""Reading a dump's JSON metadata, without torch: collection reads indexes through this alone."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .._errors import DumpFormatError
from .._gc import paused_gc

#: How deep the readers follow nested lists / objects of a dump's metadata; real dumps nest a
#: few levels (an argument list of tuples of tensors), and Python's own stack ends near 1000.
MAX_NESTING = 100
TOO_DEEP = f"nested too deeply (more than {MAX_NESTING} levels)"


@contextmanager
def reading_dump(path: Path) -> Iterator[None]:
    """Read the dump at ``path`` (its index: many long-lived objects) with the collector
    paused; an OS error is a DumpFormatError naming the file it hit, and so are nesting deeper
    than Python's stack and running out of memory, safety nets: every reader bounds its
    nesting and checks declared sizes itself."""
    try:
        with paused_gc():
            yield
    except OSError as exc:
        raise DumpFormatError(exc.filename or path, exc.strerror or str(exc)) from None
    except RecursionError:
        raise DumpFormatError(path, TOO_DEEP) from None
    except MemoryError:  # a size no reader checked: still the dump's fault, not a crash
        raise DumpFormatError(path, "declares more data than fits in memory") from None


def read_json(path: Path) -> Any:
    """A JSON file's content; a missing, unreadable or malformed file is a DumpFormatError."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise DumpFormatError(path, "missing") from None
    except json.JSONDecodeError as exc:
        raise DumpFormatError(path, f"malformed JSON: {exc}") from None
    except RecursionError:
        raise DumpFormatError(path, TOO_DEEP) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise DumpFormatError(path, f"cannot be read: {first_line(exc)}") from None


def read_json_object(path: Path) -> dict[str, Any]:
    """:func:`read_json` of a file whose top level must be an object."""
    data = read_json(path)
    if not isinstance(data, dict):
        raise DumpFormatError(path, "malformed JSON: expected an object at the top level")
    return data


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (its type name when it has none)."""
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]
