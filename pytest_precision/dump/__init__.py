"""Dumps: the native format, capture of module/op tensors, and readers for other layouts."""

from __future__ import annotations

from ._capture import Capture, capture
from ._load import load_dump
from ._records import Dump, Record

__all__ = ["Capture", "Dump", "Record", "capture", "load_dump"]
