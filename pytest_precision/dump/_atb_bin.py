"""The ``.bin`` tensor files of an ATB (msprobe ``atb_probe``) dump: header, aliases, data.

A file is ASCII ``key=value`` lines up to ``$End=1``, then the raw bytes. A tensor that an
earlier op of the same layer already saved is stored once: the later file holds no bytes and
``data=<op ids>_<intensor|outtensor><N>.bin`` names the op and tensor holding them. A kernel
tensor dropped by ``filter_level: 2`` names its own file (``data=intensor0.bin``): the data
were not saved. Details, and what is verified against msprobe's source: ``docs/atb.md``.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .._errors import DumpFormatError
from ._confine import dump_root, inside

NODE_DIR = re.compile(r"(\d+)_(\S+)")
TENSOR_FILE = re.compile(r"(intensor|outtensor)(\d+)\.bin")
_ALIAS = re.compile(r"([0-9]+(?:_[0-9]+)*)_(intensor|outtensor)([0-9]+)\.bin")
_MAX_HEADER = 4096

#: Mki dtype codes -> the names atb_probe writes in statistic.csv
MKI_DTYPES = {
    0: "float", 1: "float16", 2: "int8", 3: "int32", 4: "uint8", 6: "int16", 7: "uint16",
    8: "uint32", 9: "int64", 10: "uint64", 11: "double", 12: "bool", 13: "string",
    16: "complex64", 17: "complex128", 27: "bf16", 29: "int4", 30: "uint1", 33: "complex32",
    34: "hifloat8", 35: "float8_e5m2", 36: "float8_e4m3fn", 37: "float8_e8m0",
    38: "float6_e3m2", 39: "float6_e2m3", 40: "float4_e2m1", 41: "float4_e1m2",
}  # fmt: skip
#: Mki format codes -> the names atb_probe writes in statistic.csv
MKI_FORMATS = {
    0: "nchw", 1: "nhwc", 2: "nd", 3: "nc1hwc0", 4: "fractal_z", 12: "nc1hwc0_c04", 16: "hwcn",
    27: "ndhwc", 29: "fractal_nz", 30: "ncdhw", 32: "ndc1hwc0", 33: "fractal_z_3d", 35: "nc",
    47: "ncl", 50: "fractal_nz_c0_16", 51: "fractal_nz_c0_32",
}  # fmt: skip
#: the Mki dtypes this reader loads -> torch dtype names (the others are refused in a .bin)
DTYPES = {
    0: "float32", 1: "float16", 2: "int8", 3: "int32", 4: "uint8", 6: "int16", 7: "uint16",
    8: "uint32", 9: "int64", 10: "uint64", 11: "float64", 12: "bool", 27: "bfloat16",
}  # fmt: skip
_NUMPY = {
    "float32": np.float32, "float16": np.float16, "int8": np.int8, "int32": np.int32,
    "uint8": np.uint8, "int16": np.int16, "uint16": np.uint16, "uint32": np.uint32,
    "int64": np.int64, "uint64": np.uint64, "float64": np.float64, "bool": np.bool_,
    "bfloat16": np.int16,  # viewed as bfloat16 after loading
}  # fmt: skip
_KEYS = {"$Version", "$Object.Count", "$Object.Length", "format", "dtype", "dims", "data"}


def mki_name(code: int, names: dict[int, str]) -> str:
    """The name atb_probe writes for a dtype or format code (``undefined(<code>)`` if unknown)."""
    return names.get(code, f"undefined({code})")


@dataclass(frozen=True)
class BinHeader:
    """What a ``.bin`` file's header says, aliases resolved."""

    dtype: str
    shape: tuple[int, ...]
    format: int
    length: int
    #: the file holding the data (the target of an alias); ``None`` when they were not saved
    data_file: Path | None
    offset: int


def read_bin_header(file: Path, root: Path, *, alias_of: Path | None = None) -> BinHeader:
    """Parse and check a ``.bin`` header (and the file an alias points at) under ``root``."""
    try:
        with open(file, "rb") as f:
            head = f.read(_MAX_HEADER)
    except OSError as exc:
        raise DumpFormatError(file, f"cannot be read: {exc.strerror or exc}") from None
    end = head.find(b"$End=1\n")
    if end < 0:
        raise DumpFormatError(file, "bad .bin header: no '$End=1' line in the first 4096 bytes")
    offset = end + len(b"$End=1\n")
    fields: dict[str, str] = {}
    for number, raw in enumerate(head[:end].split(b"\n")[:-1], start=1):
        try:
            line = raw.decode("ascii")
        except UnicodeDecodeError:
            raise DumpFormatError(file, f"bad .bin header: line {number} is not ASCII") from None
        key, sep, value = line.partition("=")
        if not sep or key in fields:
            problem = f"bad .bin header: line {number} {line[:40]!r} is not a new key=value"
            raise DumpFormatError(file, problem)
        fields[key] = value
    unknown = set(fields) - _KEYS - {"$Object.data"}
    if unknown:
        raise DumpFormatError(file, f"bad .bin header: unknown keys {sorted(unknown)}")
    if fields.get("$Version") != "1.0":
        raise DumpFormatError(file, f"bad .bin header: $Version={fields.get('$Version')!r}")
    dtype, shape, fmt = _describe(file, fields)
    length = math.prod(shape) * np.dtype(_NUMPY[dtype]).itemsize
    size = os.path.getsize(file)
    if "data" in fields:
        _expect(file, fields, {"$Object.Count": "0", "$Object.Length": "0", "$Object.data": None})
        if size != offset:
            raise DumpFormatError(file, f"an alias holds no data, but {size - offset} bytes follow")
        if fields["data"] == file.name:  # filter_level 2: a kernel's tensor, not saved
            return BinHeader(dtype, shape, fmt, length, None, offset)
        if alias_of is not None:
            raise DumpFormatError(file, f"alias of an alias (from {alias_of}): refused")
        aliased = read_bin_header(_alias_target(file, root, fields["data"]), root, alias_of=file)
        if (aliased.dtype, aliased.shape) != (dtype, shape):
            raise DumpFormatError(file, f"data={fields['data']!r} holds another dtype or shape")
        return BinHeader(dtype, shape, fmt, length, aliased.data_file, aliased.offset)
    expected = {"$Object.Count": "1", "$Object.Length": str(length), "$Object.data": f"0,{length}"}
    _expect(file, fields, expected)
    if size != offset + length:
        raise DumpFormatError(file, f"{size} bytes, the header promises {offset + length}")
    return BinHeader(dtype, shape, fmt, length, file, offset)


def _int(file: Path, fields: dict[str, str], key: str) -> int:
    try:
        return int(fields[key])
    except KeyError:
        raise DumpFormatError(file, f"bad .bin header: no {key}= line") from None
    except ValueError:
        raise DumpFormatError(file, f"bad .bin header: {key}={fields[key][:40]!r}") from None


def _describe(file: Path, fields: dict[str, str]) -> tuple[str, tuple[int, ...], int]:
    """The checked dtype, dims and format of a header."""
    fmt = _int(file, fields, "format")
    code = _int(file, fields, "dtype")
    if code not in DTYPES:
        problem = f"unsupported dtype code {code} ({mki_name(code, MKI_DTYPES)})"
        raise DumpFormatError(file, f"bad .bin header: {problem}")
    dims = fields.get("dims")
    if dims is None:
        raise DumpFormatError(file, "bad .bin header: no dims= line")
    try:
        shape = tuple(int(n) for n in dims.split(",")) if dims else ()
    except ValueError:
        raise DumpFormatError(file, f"bad .bin header: dims={dims[:40]!r}") from None
    if any(n < 0 for n in shape) or len(shape) > 32:
        raise DumpFormatError(file, f"bad .bin header: dims={dims[:40]!r}")
    return DTYPES[code], shape, fmt


def _expect(file: Path, fields: dict[str, str], expected: Mapping[str, str | None]) -> None:
    """Each key of ``expected`` has that value (``None``: is absent)."""
    for key, value in expected.items():
        if fields.get(key) != value:
            kind = "an alias" if "data" in fields else "a data file"
            problem = f"{key}={fields.get(key)!r}, expected {value!r} in {kind}"
            raise DumpFormatError(file, f"bad .bin header: {problem}")


def find_node(root: Path, ids: tuple[int, ...]) -> Path | None:
    """The op folder ``<id>_<Name>/...`` of ``ids`` under the round folder ``root``."""
    folder = root
    for node_id in ids:
        matches = [d for d in subdirs(folder) if _node_id(d.name) == node_id]
        if len(matches) != 1:
            return None
        folder = matches[0]
    return folder


def _node_id(name: str) -> int | None:
    match = NODE_DIR.fullmatch(name)
    return int(match.group(1)) if match else None


def subdirs(path: Path) -> list[Path]:
    """The folders directly in ``path``, by name; symlinked folders are never followed."""
    try:
        return sorted(d for d in path.iterdir() if d.is_dir() and not d.is_symlink())
    except OSError:
        return []


def stage_of(io: str) -> str:
    """atb_probe saves inputs before an op runs, outputs after it."""
    return "before" if io == "intensor" else "after"


def _alias_target(file: Path, root: Path, alias: str) -> Path:
    """The file ``data=<op ids>_<io><N>.bin`` names: that op's tensor, in the round folder."""
    match = _ALIAS.fullmatch(alias)
    if not match:
        problem = f"data={alias[:60]!r} is not <op ids>_<intensor|outtensor><N>.bin"
        raise DumpFormatError(file, f"bad .bin header: {problem}")
    ids = tuple(int(n) for n in match.group(1).split("_"))
    node = find_node(root, ids)
    io = match.group(2)
    target = None if node is None else node / stage_of(io) / f"{io}{match.group(3)}.bin"
    if target is None or not target.is_file() or target.is_symlink():
        raise DumpFormatError(file, f"data={alias!r}: no such tensor in the round folder {root}")
    if not inside(dump_root(root), target):
        raise DumpFormatError(file, f"data={alias!r} points outside the round folder {root}")
    return target


def load_bin(header: BinHeader) -> torch.Tensor:
    """The tensor, memory-mapped copy-on-write; bfloat16 read bitwise."""
    assert header.data_file is not None
    np_dtype = _NUMPY[header.dtype]
    try:
        if math.prod(header.shape) == 0:
            array: np.ndarray[Any, Any] = np.empty(header.shape, dtype=np_dtype)
        else:
            array = np.memmap(
                header.data_file, dtype=np_dtype, mode="c", offset=header.offset,
                shape=header.shape,
            )  # fmt: skip
    except (OSError, ValueError) as exc:
        raise DumpFormatError(header.data_file, f"cannot be read: {exc}") from None
    except MemoryError:
        raise DumpFormatError(header.data_file, "cannot be mapped: not enough memory") from None
    if os.path.getsize(header.data_file) < header.offset + header.length:
        raise DumpFormatError(header.data_file, "truncated since the dump was loaded")
    tensor = torch.from_numpy(np.asarray(array))
    return tensor.view(torch.bfloat16) if header.dtype == "bfloat16" else tensor
