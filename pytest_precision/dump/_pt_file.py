"""The common ``.pt`` file, one tensor written by ``torch.save``, read without ``torch.load``.

msprobe writes one such file per tensor, and ``torch.load`` spends about half a millisecond
on each (its restricted unpickler is Python, and it builds a storage per file): on a dump of
thousands of tensors that is a large part of a comparison. This reader decodes the file's
pickle with :func:`pickletools.genops`, which only parses opcodes (nothing is imported,
called or built from the file but ints, strings and tuples), accepts exactly the opcodes
``torch.save`` writes for one plain tensor (``torch._utils._rebuild_tensor_v2`` of a typed
storage, no ``requires_grad``, no hooks, no metadata) and maps the storage's bytes from the
archive copy-on-write, as ``torch.load(mmap=True)`` does. Anything else, a malformed file
included, gives ``None``: the caller then goes through ``torch.load(weights_only=True)``,
which accepts more and reports what is wrong with a bad file.
"""

from __future__ import annotations

import functools
import math
import mmap
import pickletools
import struct
import sys
import zipfile
from pathlib import Path
from typing import Any, NamedTuple

import torch

#: The storage classes ``torch.save`` names for each dtype.
_STORAGE_DTYPES = {
    "torch FloatStorage": torch.float32,
    "torch DoubleStorage": torch.float64,
    "torch HalfStorage": torch.float16,
    "torch BFloat16Storage": torch.bfloat16,
    "torch ComplexFloatStorage": torch.complex64,
    "torch ComplexDoubleStorage": torch.complex128,
    "torch LongStorage": torch.int64,
    "torch IntStorage": torch.int32,
    "torch ShortStorage": torch.int16,
    "torch CharStorage": torch.int8,
    "torch ByteStorage": torch.uint8,
    "torch BoolStorage": torch.bool,
}
_REBUILD = "torch._utils _rebuild_tensor_v2"
_ORDERED_DICT = "collections OrderedDict"
#: Opcodes that only store into the pickle's memo (never read back: no GET is accepted).
_MEMO = frozenset({"PROTO", "FRAME", "BINPUT", "LONG_BINPUT", "PUT", "MEMOIZE"})
_VALUES = frozenset({"BININT", "BININT1", "BININT2", "LONG1", "BINUNICODE", "SHORT_BINUNICODE"})
_TUPLES = {"EMPTY_TUPLE": 0, "TUPLE1": 1, "TUPLE2": 2, "TUPLE3": 3}
_LOCAL_HEADER = struct.Struct("<4s22xHH")


class _Global(NamedTuple):
    """A ``module name`` the pickle refers to: only compared with the names above."""

    name: str


class _Storage(NamedTuple):
    dtype: torch.dtype
    key: str
    numel: int


class _Spec(NamedTuple):
    """One tensor as the pickle describes it: a view of one storage."""

    storage: _Storage
    offset: int
    size: tuple[int, ...]
    stride: tuple[int, ...]


_HOOKS = object()  # an empty OrderedDict of backward hooks


def read_pt_tensor(path: Path) -> torch.Tensor | None:
    """The tensor ``torch.save`` stored in ``path``, memory-mapped copy-on-write; None when the
    file is not exactly one plain tensor of a known dtype in little-endian order (or cannot
    be read): ``torch.load`` then decides."""
    try:
        with open(path, "rb") as f, zipfile.ZipFile(f) as archive:
            located = _locate(archive, f)
            if located is None:
                return None
            spec, start = located
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile, struct.error):
        return None
    nbytes = spec.storage.numel * spec.storage.dtype.itemsize
    if start + nbytes > len(mapped):
        return None
    storage = torch.frombuffer(
        mapped, dtype=spec.storage.dtype, count=spec.storage.numel, offset=start
    )
    return storage.as_strided(spec.size, spec.stride, spec.offset)


def _locate(archive: zipfile.ZipFile, f: Any) -> tuple[_Spec, int] | None:
    """The tensor's description and where its storage's bytes start in the file."""
    pickles = [i for i in archive.infolist() if i.filename.endswith("/data.pkl")]
    if len(pickles) != 1 or sys.byteorder != "little":
        return None
    prefix = pickles[0].filename.removesuffix("data.pkl")
    if archive.read(f"{prefix}byteorder") != b"little":
        return None
    spec = _tensor_spec(archive.read(pickles[0]))
    if spec is None:
        return None
    info = archive.getinfo(f"{prefix}data/{spec.storage.key}")
    if info.compress_type != zipfile.ZIP_STORED:
        return None
    if info.file_size != spec.storage.numel * spec.storage.dtype.itemsize:
        return None
    f.seek(info.header_offset)
    magic, name_length, extra_length = _LOCAL_HEADER.unpack(f.read(_LOCAL_HEADER.size))
    if magic != b"PK\x03\x04":
        return None
    return spec, info.header_offset + _LOCAL_HEADER.size + name_length + extra_length


@functools.lru_cache(maxsize=256)
def _tensor_spec(data: bytes) -> _Spec | None:
    """Decode the pickle of one tensor, or None for any other pickle. Values are only
    ints, strings, tuples and the markers above: nothing from the file is ever called.
    Kept by content: the tensors of one shape and dtype share their pickle byte for byte."""
    stack: list[Any] = []
    marks: list[int] = []
    try:
        for op, arg, _ in pickletools.genops(data):
            name = op.name
            if name in _MEMO:
                continue
            if name in _VALUES:
                stack.append(arg)
            elif name == "GLOBAL":
                stack.append(_Global(str(arg)))
            elif name in ("NEWTRUE", "NEWFALSE"):
                stack.append(name == "NEWTRUE")
            elif name == "MARK":
                marks.append(len(stack))
            elif name == "TUPLE":
                start = marks.pop()
                items = tuple(stack[start:])
                del stack[start:]
                stack.append(items)
            elif name in _TUPLES:
                count = _TUPLES[name]
                items = tuple(stack[len(stack) - count :]) if count else ()
                del stack[len(stack) - count :]
                stack.append(items)
            elif name == "BINPERSID":
                stack.append(_storage(stack.pop()))
            elif name == "REDUCE":
                args = stack.pop()
                stack.append(_reduce(stack.pop(), args))
            elif name == "STOP":
                return stack[0] if len(stack) == 1 and isinstance(stack[0], _Spec) else None
            else:
                return None
    except (ValueError, IndexError, _NotATensor):
        return None
    return None


class _NotATensor(Exception):
    """The pickle holds something other than one plain tensor."""


def _storage(pid: Any) -> _Storage:
    if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
        raise _NotATensor
    _, kind, key, location, numel = pid
    dtype = _STORAGE_DTYPES.get(kind.name) if isinstance(kind, _Global) else None
    if dtype is None or not isinstance(key, str) or not isinstance(location, str):
        raise _NotATensor
    if not _is_count(numel) or numel == 0:
        raise _NotATensor
    return _Storage(dtype, key, numel)


def _reduce(function: Any, args: Any) -> Any:
    if function == _Global(_ORDERED_DICT) and args == ():
        return _HOOKS
    if function != _Global(_REBUILD) or not isinstance(args, tuple) or len(args) != 6:
        raise _NotATensor
    storage, offset, size, stride, requires_grad, hooks = args
    if not isinstance(storage, _Storage) or requires_grad is not False or hooks is not _HOOKS:
        raise _NotATensor
    shape_ok = isinstance(size, tuple) and isinstance(stride, tuple) and len(size) == len(stride)
    if not (shape_ok and _is_count(offset) and all(map(_is_count, (*size, *stride)))):
        raise _NotATensor
    # the view must lie inside its storage
    last = offset + sum((n - 1) * s for n, s in zip(size, stride, strict=True))
    if math.prod(size) and last >= storage.numel:
        raise _NotATensor
    return _Spec(storage, offset, size, stride)


def _is_count(value: Any) -> bool:
    return type(value) is int and value >= 0
