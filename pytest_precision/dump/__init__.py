"""Dumps: the native format, capture of module/op tensors, and readers for other layouts.

Names load on first use: the replay plugin indexes native dumps at collection time without
importing torch (see ``_call_index``), which importing the capture and readers here would undo.
"""

from __future__ import annotations

import typing

from .._lazy import lazy_getattr

if typing.TYPE_CHECKING:
    from ._capture import Capture, capture
    from ._load import load_dump
    from ._records import Dump, Record

__all__ = ["Capture", "Dump", "Record", "capture", "load_dump"]

_MODULE_OF = {
    "Capture": "._capture",
    "capture": "._capture",
    "load_dump": "._load",
    "Dump": "._records",
    "Record": "._records",
}


__getattr__ = lazy_getattr(globals(), _MODULE_OF)
