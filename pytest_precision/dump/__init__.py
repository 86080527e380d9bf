"""Dumps: the native format, capture of module/op tensors, and readers for other layouts.

Names load on first use: the replay plugin indexes native dumps at collection time without
importing torch (see ``_call_index``), which importing the capture and readers here would undo.
"""

from __future__ import annotations

import typing

from .._lazy import exports

if typing.TYPE_CHECKING:
    from ._capture import Capture, capture
    from ._load import load_dump
    from ._records import Dump, Record

#: Each public name and the module it lives in: the one list of this package's surface.
_MODULES = {
    "._capture": ("Capture", "capture"),
    "._load": ("load_dump",),
    "._records": ("Dump", "Record"),
}

__all__, __getattr__, __dir__ = exports(globals(), _MODULES)
