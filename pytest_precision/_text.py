"""Text from a dump, made safe to show: in a terminal, a log, a spreadsheet.

Every name a dump holds (call, module, slot, path, reason quoting them) was written by another
machine or person. Printed raw, an ANSI or OSC escape in a name can clear the screen, retitle the
terminal or paint a fake verdict; a newline can forge a report line; a bidi override can reorder
what the reader sees. A spreadsheet runs a cell that starts with ``=`` as a formula. The helpers
here are the one place that neutralises those; every renderer uses them. Torch-free.
"""

from __future__ import annotations

import re

#: Bidi embeddings and overrides (U+202A-U+202E) and isolates (U+2066-U+2069): they reorder the
#: characters around them on screen, so a name can read as something else.
_BIDI = "\u202a-\u202e\u2066-\u2069"

#: Every character a terminal may act on rather than show: C0, DEL, C1, and the bidi controls.
_CONTROL = re.compile(f"[\x00-\x1f\x7f-\x9f{_BIDI}]")

#: The same, less the line breaks and tabs a rendered report is made of.
_CONTROL_IN_TEXT = re.compile(f"[\x00-\x08\x0b-\x1f\x7f-\x9f{_BIDI}]")

#: The first characters a spreadsheet reads as the start of a formula (or, tab and CR, as a
#: cell split that hides one).
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


#: How a non-finite float reads when this package writes it as text (JSON has no infinity):
#: a number, not a formula.
_FLOAT_TEXT = frozenset({"-inf", "+inf"})


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def shown(name: object) -> str:
    """``name`` as one line of plain text: each control character written as its escape
    (``\\x1b``, ``\\n``'s ``\\x0a``, ``\\u202e``), everything else as it is."""
    return _CONTROL.sub(_escaped, str(name))


def shown_text(text: str) -> str:
    """A rendered report (many lines) safe for a terminal: every control character escaped as
    :func:`shown` does, but the report's own line breaks and tabs kept."""
    return _CONTROL_IN_TEXT.sub(_escaped, text)


def spreadsheet_cell(value: object) -> object:
    """``value`` as a CSV cell no spreadsheet runs: a string that starts like a formula gets a
    leading ``'`` (the quote spreadsheets hide and read as "text"). Numbers stay numbers: only
    strings are touched, so a float this package wrote (``-1.5e-3``) is still a number."""
    if isinstance(value, str) and value.startswith(_FORMULA_START) and value not in _FLOAT_TEXT:
        return "'" + value
    return value
