"""Reading tensor files without ever executing code from them.

``.pt`` goes only through ``torch.load(weights_only=True)``, or, one plain tensor, through
:mod:`._pt_file`, which decodes the pickle's opcodes and runs none; ``.npy`` / ``.npz`` through
numpy with ``allow_pickle=False``; safetensors through its own header-checked reader. Every
failure becomes a :class:`DumpFormatError` naming the file, so a bad or hostile file is one
clear line for the user, never a traceback and never a side effect. Sizes a file declares (a
``.npy`` header's shape, safetensors offsets, a ``.npz`` member's size) are checked against the
bytes actually there before anything is allocated, and a compressed ``.npz`` member may inflate
to at most :func:`max_inflated_bytes`, streamed in chunks so a member lying about its size is
caught while reading, not after filling memory. Data is memory-mapped where the format allows
(``.npy``, zip-format ``.pt``, safetensors); mappings are copy-on-write, so a caller that writes
to a loaded tensor never touches the file.
"""

from __future__ import annotations

import json
import math
import os
import struct
import threading
import tokenize
import zipfile
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any, NamedTuple

import numpy as np
import torch

from .._errors import DumpFormatError, PrecisionError
from ..numerics._dtypes import dtype_name
from ._json_files import TOO_DEEP, first_line
from ._pt_file import read_pt_tensor

_MAX_NPY_HEADER = 10_000

#: The most bytes one compressed ``.npz`` member may inflate to, unless
#: :data:`MAX_INFLATED_ENV` says otherwise: a few MB of deflated zeros can claim gigabytes.
MAX_INFLATED_BYTES = 1 << 30
MAX_INFLATED_ENV = "PYTEST_PRECISION_MAX_INFLATED_BYTES"
#: ``.npz`` members are inflated this many bytes at a time: chunks that stay in cache read a
#: 64 MiB member in 103 ms (as fast as numpy's own reader), 16 MiB chunks took 235 ms.
_CHUNK_BYTES = 1 << 18

#: What numpy raises on a malformed header (it parses the header with ``ast.literal_eval``) or
#: a damaged archive.
_NPZ_ERRORS = (
    OSError, ValueError, SyntaxError, tokenize.TokenError, zipfile.BadZipFile, EOFError,
    NotImplementedError,  # zipfile: "compressed patched data"
)  # fmt: skip

#: safetensors' dtype codes, by the torch dtype name used in records.
SAFETENSORS_DTYPES = {
    "BOOL": "bool",
    "U8": "uint8",
    "I8": "int8",
    "I16": "int16",
    "U16": "uint16",
    "I32": "int32",
    "U32": "uint32",
    "I64": "int64",
    "U64": "uint64",
    "F16": "float16",
    "BF16": "bfloat16",
    "F32": "float32",
    "F64": "float64",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "C64": "complex64",
}


def load_pt(path: Path) -> Any:
    """The object stored in a ``.pt`` file; refuses anything but tensors and plain containers."""
    try:
        try:
            return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as exc:
            if "mmap" not in str(exc):
                raise
            # legacy (non-zip) serialization cannot be mapped; read it whole
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch reports bad files with many exception types
        problem = f"cannot be loaded safely as a tensor file: {torch_load_reason(exc)}"
        raise DumpFormatError(path, problem) from None


def torch_load_reason(exc: BaseException) -> str:
    """torch's reason, without its advice to retry with ``weights_only=False``: that runs
    the pickle code stored in the file, which a dump reader never does."""
    text = str(exc)
    unsupported = [line.strip() for line in text.splitlines() if "Unsupported global" in line]
    if unsupported:
        return (
            unsupported[0].split(" was not")[0]
            + "; it is not a plain file of tensors, and loading it would run code stored in "
            "it. Re-save it with safetensors or torch.save of tensors only"
        )
    if "weights_only" in text or "Weights only load failed" in text:
        inner = [
            line.strip()
            for line in text.splitlines()
            if line.strip()
            and "weights_only" not in line
            and "Weights only" not in line
            and "trust the source" not in line
            and not line.strip().startswith("(")
        ]
        detail = inner[-1] if inner else "not a torch tensor file"
        return (
            f"{detail}; it is not a plain file of tensors (pickle code is never run). Re-save "
            "it with safetensors or torch.save of tensors only"
        )
    return first_line(exc)


def load_pt_tensor(path: Path) -> torch.Tensor:
    """The one tensor of a ``.pt`` file: read directly when ``torch.save`` wrote one plain
    tensor (:mod:`._pt_file`, ten times faster), else through :func:`load_pt`."""
    direct = read_pt_tensor(path)
    if direct is not None:
        return direct
    value = load_pt(path)
    if not isinstance(value, torch.Tensor):
        raise DumpFormatError(path, f"holds a {type(value).__name__}, expected one tensor")
    return value


def npy_header(path: Path) -> tuple[tuple[int, ...], np.dtype[Any]]:
    """Shape and dtype of a ``.npy`` file, after checking the file holds all its data."""
    try:
        with open(path, "rb") as f:
            shape, fortran_order, dtype = _read_npy_header(f)
            data_start = f.tell()
    except (OSError, ValueError, SyntaxError, tokenize.TokenError) as exc:
        raise DumpFormatError(path, f"not a valid .npy file: {first_line(exc)}") from None
    if dtype.hasobject:
        raise DumpFormatError(path, "holds Python objects (pickle); refused")
    if fortran_order:
        raise DumpFormatError(path, "Fortran-ordered arrays are not supported")
    needed = data_start + math.prod(shape) * dtype.itemsize  # Python ints: no overflow
    size = os.path.getsize(path)
    if size < needed:
        raise DumpFormatError(path, f"truncated: {size} bytes, header promises {needed}")
    return tuple(int(n) for n in shape), dtype


def _read_npy_header(f: IO[bytes]) -> tuple[tuple[int, ...], bool, np.dtype[Any]]:
    """Shape, Fortran order and dtype from an open ``.npy`` stream; the header is never eval'd."""
    version = np.lib.format.read_magic(f)
    if version == (1, 0):
        return np.lib.format.read_array_header_1_0(f, max_header_size=_MAX_NPY_HEADER)
    if version == (2, 0):
        return np.lib.format.read_array_header_2_0(f, max_header_size=_MAX_NPY_HEADER)
    raise ValueError(f".npy format version {version} is not supported")


def npy_dtype_name(dtype: np.dtype[Any], path: Path) -> str:
    """Record dtype name of a numpy dtype; 2-byte opaque (``V2``) is ml_dtypes' bfloat16."""
    if dtype.kind == "V" and dtype.itemsize == 2 and dtype.fields is None:
        return "bfloat16"
    try:
        return dtype_name(torch.from_numpy(np.empty(0, dtype=dtype)).dtype)
    except (TypeError, ValueError):
        raise DumpFormatError(path, f"numpy dtype {dtype.str!r} has no torch equivalent") from None


def array_to_tensor(array: np.ndarray[Any, Any], path: Path) -> torch.Tensor:
    if array.dtype.kind == "V" and array.dtype.itemsize == 2 and array.dtype.fields is None:
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    npy_dtype_name(array.dtype, path)
    return torch.from_numpy(array)


def load_npy(path: Path) -> torch.Tensor:
    """A ``.npy`` file as a tensor, memory-mapped copy-on-write; bfloat16 from ml_dtypes' ``V2``."""
    npy_header(path)
    try:
        array = np.load(path, mmap_mode="c", allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise DumpFormatError(path, f"cannot be read: {first_line(exc)}") from None
    except MemoryError:
        raise DumpFormatError(path, "cannot be mapped: not enough memory") from None
    return array_to_tensor(array, path)


def max_inflated_bytes() -> int:
    """The cap on one compressed ``.npz`` member's size: :data:`MAX_INFLATED_ENV`, else
    :data:`MAX_INFLATED_BYTES`."""
    raw = os.environ.get(MAX_INFLATED_ENV, "").strip()
    if not raw:
        return MAX_INFLATED_BYTES
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value <= 0:
        raise PrecisionError(f"{MAX_INFLATED_ENV}={raw!r}: expected a positive number of bytes")
    return value


class _Member(NamedTuple):
    """A ``.npz`` member's array, as its header describes it and the archive confirms."""

    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    fortran_order: bool
    nbytes: int


def _check_member(path: Path, archive: zipfile.ZipFile, info: zipfile.ZipInfo, cap: int) -> _Member:
    """The member's array, after checking the sizes it declares: under ``cap`` when
    compressed, and its header's shape x itemsize exactly the member's declared size."""
    key = info.filename.removesuffix(".npy")
    compressed = info.compress_type != zipfile.ZIP_STORED
    if compressed and info.file_size > cap:
        raise DumpFormatError(
            path,
            f"array {key!r} inflates to {info.file_size} bytes, over the {cap}-byte limit "
            f"(raise it with {MAX_INFLATED_ENV})",
        )
    if not compressed and info.compress_size != info.file_size:
        problem = f"array {key!r}: stored member of {info.file_size} bytes in {info.compress_size}"
        raise DumpFormatError(path, problem)
    with archive.open(info) as f:
        shape, fortran_order, dtype = _read_npy_header(f)
        data_start = f.tell()
    if dtype.hasobject:
        raise DumpFormatError(path, f"array {key!r} holds Python objects")
    nbytes = math.prod(shape) * dtype.itemsize
    if data_start + nbytes != info.file_size:
        raise DumpFormatError(
            path,
            f"array {key!r}: its header declares {nbytes} bytes of data, the archive member "
            f"holds {info.file_size - data_start}",
        )
    return _Member(tuple(int(n) for n in shape), dtype, fortran_order, nbytes)


def npz_members(path: Path) -> dict[str, tuple[tuple[int, ...], np.dtype[Any]]]:
    """Shape and dtype of every array in a ``.npz`` archive, read from the headers only."""
    members: dict[str, tuple[tuple[int, ...], np.dtype[Any]]] = {}
    cap = max_inflated_bytes()
    try:
        with zipfile.ZipFile(path) as archive:
            for info in archive.infolist():
                if not info.filename.endswith(".npy"):
                    continue
                member = _check_member(path, archive, info, cap)
                members[info.filename.removesuffix(".npy")] = (member.shape, member.dtype)
    except DumpFormatError:
        raise
    except _NPZ_ERRORS as exc:
        raise DumpFormatError(path, f"not a valid .npz archive: {first_line(exc)}") from None
    return members


def load_npz_array(path: Path, key: str) -> torch.Tensor:
    """One array of a ``.npz``, its sizes checked first (:func:`_check_member`), then inflated
    in chunks into an array of exactly the declared size: a member inflating to more than it
    declares fails its CRC check at the declared end, one inflating to less is truncated."""
    cap = max_inflated_bytes()
    try:
        with zipfile.ZipFile(path) as archive:
            info = archive.getinfo(f"{key}.npy")
            member = _check_member(path, archive, info, cap)
            shape = member.shape[::-1] if member.fortran_order else member.shape
            try:
                array = np.empty(shape, dtype=member.dtype)
            except MemoryError:
                problem = f"array {key!r} ({member.nbytes} bytes) does not fit in memory"
                raise DumpFormatError(path, problem) from None
            with archive.open(info) as f:
                _read_npy_header(f)
                _read_into(path, key, f, array)
    except DumpFormatError:
        raise
    except (*_NPZ_ERRORS, KeyError) as exc:
        raise DumpFormatError(path, f"array {key!r} cannot be read: {first_line(exc)}") from None
    return array_to_tensor(array.T if member.fortran_order else array, path)


def _read_into(path: Path, key: str, f: IO[bytes], array: np.ndarray[Any, Any]) -> None:
    """Fill ``array`` (C-contiguous) from ``f`` chunk by chunk; ``f`` must then be at its end."""
    buffer = array.reshape(-1).view(np.uint8).data  # a view: filling it fills ``array``
    filled = 0
    while filled < len(buffer):
        chunk = f.read(min(_CHUNK_BYTES, len(buffer) - filled))
        if not chunk:
            problem = f"array {key!r} truncated: {filled} of {len(buffer)} bytes"
            raise DumpFormatError(path, problem)
        buffer[filled : filled + len(chunk)] = chunk
        filled += len(chunk)
    if f.read(1):
        raise DumpFormatError(path, f"array {key!r} holds more data than its header declares")


def safetensors_header(path: Path) -> dict[str, tuple[tuple[int, ...], str]]:
    """Shape and record dtype name of every tensor, after checking offsets against the file size."""
    size = os.path.getsize(path)
    try:
        with open(path, "rb") as f:
            (header_len,) = struct.unpack("<Q", f.read(8))
            if header_len > size - 8:
                raise ValueError(f"header length {header_len} exceeds the file size {size}")
            header = json.loads(f.read(header_len))
    except (OSError, struct.error, ValueError) as exc:
        raise DumpFormatError(path, f"not a valid safetensors file: {first_line(exc)}") from None
    except RecursionError:
        raise DumpFormatError(path, f"safetensors header {TOO_DEEP}") from None
    if not isinstance(header, Mapping):
        raise DumpFormatError(path, "safetensors header is not a JSON object")
    tensors: dict[str, tuple[tuple[int, ...], str]] = {}
    for key, entry in header.items():
        if key == "__metadata__":
            continue
        try:
            dtype = SAFETENSORS_DTYPES[entry["dtype"]]
            shape = tuple(int(n) for n in entry["shape"])
            begin, end = (int(n) for n in entry["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise DumpFormatError(
                path, f"tensor {key!r}: malformed header entry {entry!r}"
            ) from None
        if 8 + header_len + end > size:
            raise DumpFormatError(
                path, f"truncated: tensor {key!r} ends at byte {8 + header_len + end} of {size}"
            )
        nbytes = math.prod(shape) * getattr(torch, dtype).itemsize
        if not 0 <= begin <= end or end - begin != nbytes or min(shape, default=0) < 0:
            raise DumpFormatError(
                path,
                f"tensor {key!r}: offsets {begin}..{end} do not hold its {dtype} {list(shape)} "
                f"({nbytes} bytes)",
            )
        tensors[key] = (shape, dtype)
    return tensors


def load_safetensors_tensor(path: Path, key: str) -> torch.Tensor:
    try:
        return _open_safetensors(path).get_tensor(key)
    except Exception as exc:  # safetensors raises its own error type, plus OSError
        raise DumpFormatError(path, f"tensor {key!r} cannot be read: {first_line(exc)}") from None


#: Open safetensors files, most recently used last. Opening parses the whole header, so a
#: shard of 500 tensors read one tensor at a time cost 0.5 ms per tensor instead of 8 us.
_open_files: OrderedDict[tuple[str, int, int, int], Any] = OrderedDict()


_open_files_lock = threading.Lock()


_MAX_OPEN_FILES = 16


def _open_safetensors(path: Path) -> Any:
    """A cached ``safe_open`` handle; a file replaced since (another inode, size or mtime) is
    opened afresh."""
    from safetensors import safe_open

    stat = path.stat()
    key = (str(path), stat.st_ino, stat.st_size, stat.st_mtime_ns)
    with _open_files_lock:
        handle = _open_files.get(key)
        if handle is not None:
            _open_files.move_to_end(key)
            return handle
    handle = safe_open(str(path), framework="pt")
    with _open_files_lock:
        _open_files[key] = handle
        while len(_open_files) > _MAX_OPEN_FILES:
            _open_files.popitem(last=False)
    return handle
