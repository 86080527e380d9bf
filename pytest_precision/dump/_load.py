"""``load_dump``: recognize a dump's layout and hand it to the matching reader."""

from __future__ import annotations

import os
from pathlib import Path

from .._errors import DumpFormatError, PrecisionInputError
from ._atb import is_atb_dump, read_atb_dump
from ._json_files import reading_dump
from ._mindspore import is_mindspore_dump, read_mindspore_dump
from ._msprobe import is_msprobe_dump, read_msprobe_dump
from ._native import read_native_dump
from ._native_index import is_native_dump
from ._plain import SUFFIXES, read_plain_dump, tensor_files
from ._records import Dump


def load_dump(path: str | os.PathLike[str]) -> Dump:
    """Load a dump: native, msprobe, or a folder (or one file) of .npy/.npz/.pt/.safetensors.

    Records come in execution order with their metadata; tensors are read only by
    ``Record.load()``. Any malformed, incomplete or unsafe input raises :class:`DumpFormatError`.
    """
    path = Path(path)
    with reading_dump(path):
        return _dispatch(path)


def _dispatch(path: Path) -> Dump:
    if not path.exists():
        raise DumpFormatError(path, "no such file or directory")
    if path.is_file():
        if path.name == "dump.json":
            return read_msprobe_dump(path.parent)
        if path.suffix in SUFFIXES:
            return read_plain_dump(path)
        raise DumpFormatError(path, f"unknown dump file type; expected dump.json or {_suffixes()}")
    if is_native_dump(path):
        return read_native_dump(path)
    if is_msprobe_dump(path):
        return read_msprobe_dump(path)
    if is_atb_dump(path):
        return read_atb_dump(path)
    if is_mindspore_dump(path):
        return read_mindspore_dump(path)
    if tensor_files(path):
        return read_plain_dump(path)
    if not any(path.iterdir()):
        raise DumpFormatError(path, "empty folder, not a dump")
    raise DumpFormatError(
        path,
        "unknown dump layout: no native manifest, no msprobe dump.json "
        f"(step*/rank*|proc*/), no ATB atb_dump_data/data/<device>_<pid>/<round>/, "
        "no MindSpore rank_<r>/<net>/<graph>/<iteration>/, "
        f"no {_suffixes()} files",
    )


def _suffixes() -> str:
    return "/".join(SUFFIXES)


def as_dump(value: Dump | str | os.PathLike[str]) -> Dump:
    """A :class:`Dump` as it is, or the dump a path names."""
    if isinstance(value, Dump):
        return value
    if isinstance(value, (str, os.PathLike)):
        return load_dump(value)
    raise PrecisionInputError(f"expected a Dump or a path to one, got {type(value).__name__}")
