"""Reader for ATB (MindIE) dumps written by msprobe's ``atb_probe``.

Layout: ``atb_dump_data/data/<device>_<pid>/<round>/<layerId>_<Layer>/<opId>_<Op>/.../``
with ``before/intensor<N>.bin`` (inputs, saved before the op ran), ``after/outtensor<N>.bin``
(outputs) and, for the statistics task, ``statistic.csv`` per round. Layer -> operation ->
kernel nesting becomes the module path (``layers.<layerId>.<opId>_<Op>.<kernelId>_<Kernel>``),
so localization works layer first, then op. Details and the ``.bin`` header: ``docs/atb.md``.
"""

from __future__ import annotations

import csv
import functools
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .._errors import DumpFormatError
from ..numerics._stats import TensorStats
from ._records import Dump, Record
from ._safe_io import MAX_NESTING

FORMAT = "atb"
ROOT_NAME = "atb_dump_data"
STATISTICS = "statistic.csv"

_PROCESS_DIR = re.compile(r"(\d+)_(\d+)")
_ROUND_DIR = re.compile(r"\d+")
_NODE_DIR = re.compile(r"(\d+)_(\S+)")
_TENSOR_FILE = re.compile(r"(intensor|outtensor)(\d+)\.bin")
_MAX_HEADER = 4096

#: Mki / ACL dtype codes -> torch dtype names (13 string and the complex types are refused)
DTYPES = {
    0: "float32",
    1: "float16",
    2: "int8",
    3: "int32",
    4: "uint8",
    6: "int16",
    7: "uint16",
    8: "uint32",
    9: "int64",
    10: "uint64",
    11: "float64",
    12: "bool",
    27: "bfloat16",
}
_NUMPY = {
    "float32": np.float32,
    "float16": np.float16,
    "int8": np.int8,
    "int32": np.int32,
    "uint8": np.uint8,
    "int16": np.int16,
    "uint16": np.uint16,
    "uint32": np.uint32,
    "int64": np.int64,
    "uint64": np.uint64,
    "float64": np.float64,
    "bool": np.bool_,
    "bfloat16": np.int16,  # viewed as bfloat16 after loading
}
#: statistic.csv's 15 columns, in order
STAT_COLUMNS = (
    "device_id",
    "pid",
    "round",
    "op_id",
    "op_name",
    "stage",
    "io",
    "index",
    "format",
    "dtype",
    "shape",
    "max",
    "min",
    "mean",
    "l2norm",
)
_HEADER_KEYS = ("$Version", "$Object.Count", "$Object.Length", "format", "dtype", "dims")


@dataclass(frozen=True)
class BinHeader:
    """What a ``.bin`` file's ASCII header says."""

    dtype: str
    shape: tuple[int, ...]
    format: int
    length: int
    #: the file holding the data when this one is an alias (``data=``), else this file
    data_file: Path
    offset: int


# -- layout ----------------------------------------------------------------------------------------


def is_atb_dump(path: Path) -> bool:
    """An ``atb_dump_data`` folder, its ``data/``, a ``<device>_<pid>`` or a round folder."""
    return bool(_locate(path))


def _subdirs(path: Path) -> list[Path]:
    try:
        return sorted(d for d in path.iterdir() if d.is_dir() and not d.is_symlink())
    except OSError:
        return []


def _is_round(path: Path) -> bool:
    return bool(_ROUND_DIR.fullmatch(path.name)) and (
        any(_NODE_DIR.fullmatch(d.name) for d in _subdirs(path)) or (path / STATISTICS).is_file()
    )


def _locate(path: Path) -> list[tuple[int, int, Path]]:
    """``(device, round, round folder)`` of every round under ``path``."""
    if (path / ROOT_NAME).is_dir():
        path = path / ROOT_NAME
    if path.name == ROOT_NAME and (path / "data").is_dir():
        path = path / "data"
    if _is_round(path):
        process = _PROCESS_DIR.fullmatch(path.parent.name)
        device = int(process.group(1)) if process else 0
        return [(device, int(path.name), path)]
    processes = [(d, m) for d in _subdirs(path) if (m := _PROCESS_DIR.fullmatch(d.name))]
    if _PROCESS_DIR.fullmatch(path.name):
        processes = [(path, _PROCESS_DIR.fullmatch(path.name))]
    located = []
    for folder, match in processes:
        assert match is not None
        for r in _subdirs(folder):
            if _is_round(r):
                located.append((int(match.group(1)), int(r.name), r))
    return sorted(located, key=lambda x: (x[1], x[0], str(x[2])))


def read_atb_dump(path: Path) -> Dump:
    located = _locate(path)
    if not located:
        raise DumpFormatError(path, "not an ATB dump: no <device>_<pid>/<round>/ folders")
    records: list[Record] = []
    for device, round_, folder in located:
        has_bins = any(folder.rglob("*.bin"))
        if has_bins or not (folder / STATISTICS).is_file():
            for node in _nodes(folder):
                _read_node(node, "", device, round_, folder, records, 0)
        else:
            records.extend(_read_statistics(folder / STATISTICS, device, round_))
    return Dump(path=path, format=FORMAT, records=records, environment={"framework": "atb"})


def _nodes(folder: Path) -> list[tuple[int, str, Path]]:
    """``(id, name, folder)`` of the op folders directly under ``folder``, by id."""
    found = []
    for d in _subdirs(folder):
        match = _NODE_DIR.fullmatch(d.name)
        if match:
            found.append((int(match.group(1)), match.group(2), d))
    return sorted(found, key=lambda n: n[0])


def module_path(parent: str, node_id: int, name: str) -> str:
    """``layers.<id>`` for a layer-level operation, ``<parent>.<id>_<Name>`` below it."""
    return f"layers.{node_id}" if not parent else f"{parent}.{node_id}_{name}"


def kind_of(name: str, has_children: bool) -> str:
    if has_children:
        return "Module"
    return "Kernel" if name.endswith("Kernel") else "Operation"


def _read_node(
    node: tuple[int, str, Path],
    parent: str,
    device: int,
    round_: int,
    root: Path,
    out: list[Record],
    depth: int,
) -> None:
    node_id, name, folder = node
    if depth > MAX_NESTING:
        raise DumpFormatError(folder, f"ops nested more than {MAX_NESTING} levels deep")
    children = _nodes(folder)
    module = module_path(parent, node_id, name)
    kind = kind_of(name, bool(children))
    fields = {
        "name": f"{kind}.{module}.{name}.forward.0",
        "kind": kind,
        "op": name,
        "module": module,
        "parent": None,
        "rank": device,
        "step": round_,
    }
    out.extend(_tensors(folder / "before", "before", fields, root))
    for child in children:
        _read_node(child, module, device, round_, root, out, depth + 1)
    out.extend(_tensors(folder / "after", "after", fields, root))


def _slot(stage: str, io: str, index: int) -> str:
    """``before/intensor`` -> ``input``, ``after/outtensor`` -> ``output``; the inputs as they
    were after the op ran (in-place ops) and outputs before it are ``<stage>_input`` etc."""
    base = "input" if io == "intensor" else "output"
    natural = (stage, io) in (("before", "intensor"), ("after", "outtensor"))
    return f"{base}.{index}" if natural else f"{stage}_{base}.{index}"


def _tensors(folder: Path, stage: str, fields: dict[str, Any], root: Path) -> list[Record]:
    if not folder.is_dir():
        return []
    files = []
    for f in folder.iterdir():
        match = _TENSOR_FILE.fullmatch(f.name)
        if match:
            files.append((match.group(1) != "intensor", int(match.group(2)), match.group(1), f))
    records = []
    for _, index, io, file in sorted(files):
        if file.is_symlink() and not file.resolve().is_relative_to(root.resolve()):
            raise DumpFormatError(file, f"a symlink leading out of the round folder {root}")
        header = read_bin_header(file, root)
        records.append(
            Record(
                slot=_slot(stage, io, index),
                dtype=header.dtype,
                shape=header.shape,
                loader=functools.partial(load_bin, header),
                data_id=f"{header.data_file}",
                **fields,
            )
        )
    return records


# -- the .bin file ---------------------------------------------------------------------------------


def read_bin_header(file: Path, root: Path, *, alias_of: Path | None = None) -> BinHeader:
    """Parse and check a ``.bin`` header (and the file an alias points at)."""
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
    return _check_header(file, root, fields, offset, alias_of)


def _int(file: Path, fields: dict[str, str], key: str) -> int:
    try:
        return int(fields[key])
    except KeyError:
        raise DumpFormatError(file, f"bad .bin header: no {key}= line") from None
    except ValueError:
        raise DumpFormatError(file, f"bad .bin header: {key}={fields[key][:40]!r}") from None


def _check_header(
    file: Path, root: Path, fields: dict[str, str], offset: int, alias_of: Path | None
) -> BinHeader:
    unknown = set(fields) - {*_HEADER_KEYS, "data", "$Object.data"}
    if unknown:
        raise DumpFormatError(file, f"bad .bin header: unknown keys {sorted(unknown)}")
    if fields.get("$Version") != "1.0":
        raise DumpFormatError(file, f"bad .bin header: $Version={fields.get('$Version')!r}")
    if _int(file, fields, "$Object.Count") != 1:
        raise DumpFormatError(file, "bad .bin header: $Object.Count must be 1")
    length = _int(file, fields, "$Object.Length")
    fmt = _int(file, fields, "format")
    code = _int(file, fields, "dtype")
    if code not in DTYPES:
        raise DumpFormatError(file, f"bad .bin header: unsupported dtype code {code}")
    dtype = DTYPES[code]
    dims = fields.get("dims")
    if dims is None:
        raise DumpFormatError(file, "bad .bin header: no dims= line")
    try:
        shape = tuple(int(n) for n in dims.split(",")) if dims else ()
    except ValueError:
        raise DumpFormatError(file, f"bad .bin header: dims={dims[:40]!r}") from None
    if any(n < 0 for n in shape) or len(shape) > 32:
        raise DumpFormatError(file, f"bad .bin header: dims={dims[:40]!r}")
    itemsize = np.dtype(_NUMPY[dtype]).itemsize
    if length < 0 or length != math.prod(shape) * itemsize:
        problem = f"bad .bin header: $Object.Length={length}, dims {list(shape)} of {dtype} need"
        raise DumpFormatError(file, f"{problem} {math.prod(shape) * itemsize}")
    if fields.get("$Object.data") != f"0,{length}":
        found = fields.get("$Object.data")
        problem = f"bad .bin header: $Object.data={found!r}, expected 0,{length}"
        raise DumpFormatError(file, problem)
    size = os.path.getsize(file)
    header = BinHeader(dtype, shape, fmt, length, file, offset)
    if "data" in fields:
        if alias_of is not None:
            raise DumpFormatError(file, f"alias of an alias (from {alias_of}): refused")
        target = _alias_target(file, root, fields["data"])
        aliased = read_bin_header(target, root, alias_of=file)
        if (aliased.dtype, aliased.shape) != (dtype, shape):
            raise DumpFormatError(file, f"data={fields['data']!r} holds another dtype or shape")
        if size != offset:
            raise DumpFormatError(file, f"an alias holds no data, but {size - offset} bytes follow")
        return BinHeader(dtype, shape, fmt, length, aliased.data_file, aliased.offset)
    if size != offset + length:
        raise DumpFormatError(file, f"{size} bytes, the header promises {offset + length}")
    return header


def _alias_target(file: Path, root: Path, alias: str) -> Path:
    """The file ``data=`` names, relative to the round folder ``root``, which it must stay in."""
    relative = Path(alias)
    target = root / relative
    inside = not relative.is_absolute() and ".." not in relative.parts
    if not inside or not target.resolve().is_relative_to(root.resolve()):
        raise DumpFormatError(file, f"data={alias!r} points outside the round folder {root}")
    if target.suffix != ".bin" or not target.is_file() or target.is_symlink():
        raise DumpFormatError(file, f"data={alias!r}: no such .bin file in the dump")
    return target


def load_bin(header: BinHeader) -> torch.Tensor:
    dtype = header.dtype
    np_dtype = _NUMPY[dtype]
    numel = math.prod(header.shape)
    try:
        if numel == 0:
            array = np.empty(header.shape, dtype=np_dtype)
        else:
            array = np.memmap(
                header.data_file, dtype=np_dtype, mode="c", offset=header.offset,
                shape=header.shape,
            )  # fmt: skip
    except (OSError, ValueError) as exc:
        raise DumpFormatError(header.data_file, f"cannot be read: {exc}") from None
    if os.path.getsize(header.data_file) < header.offset + header.length:
        raise DumpFormatError(header.data_file, "truncated since the dump was loaded")
    tensor = torch.from_numpy(np.asarray(array))
    return tensor.view(torch.bfloat16) if dtype == "bfloat16" else tensor


# -- statistics ------------------------------------------------------------------------------------


def _read_statistics(path: Path, device: int, round_: int) -> list[Record]:
    try:
        with open(path, encoding="utf-8", newline="") as f:
            rows = list(csv.reader(f))
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise DumpFormatError(path, f"cannot be read as CSV: {exc}") from None
    if not rows or tuple(c.strip() for c in rows[0]) != STAT_COLUMNS:
        raise DumpFormatError(path, f"first row must be the {len(STAT_COLUMNS)} column names")
    for number, row in enumerate(rows[1:], start=2):
        if len(row) != len(STAT_COLUMNS):
            problem = f"row {number}: {len(row)} columns, expected {len(STAT_COLUMNS)}"
            raise DumpFormatError(path, problem)
    table = [dict(zip(STAT_COLUMNS, row, strict=True)) for row in rows[1:]]
    parents = {r["op_name"].rpartition("/")[0] for r in table}
    return [
        _stat_record(path, number, row, device, round_, row["op_name"] in parents)
        for number, row in enumerate(table, start=2)
    ]


def _stat_record(
    path: Path, number: int, row: dict[str, str], device: int, round_: int, has_children: bool
) -> Record:
    where = f"row {number}"
    try:
        values = [float(row[k]) for k in ("max", "min", "mean", "l2norm")]
        shape = tuple(int(n) for n in row["shape"].split(",")) if row["shape"] else ()
        index, code = int(row["index"]), int(row["dtype"])
        if (int(row["device_id"]), int(row["round"])) != (device, round_):
            raise ValueError("device_id / round disagree with the folder")
        int(row["format"])
    except ValueError as exc:
        raise DumpFormatError(path, f"{where}: {exc}") from None
    if code not in DTYPES or row["stage"] not in ("before", "after") or any(n < 0 for n in shape):
        raise DumpFormatError(path, f"{where}: bad dtype, stage or shape")
    if row["io"] not in ("intensor", "outtensor"):
        raise DumpFormatError(path, f"{where}: io must be intensor or outtensor")
    parts = row["op_name"].split("/")
    module = ""
    matches = [_NODE_DIR.fullmatch(p) for p in parts]
    if not parts or not all(matches) or len(parts) > MAX_NESTING:
        problem = f"{where}: op_name {row['op_name'][:60]!r} is not <id>_<Op>/..."
        raise DumpFormatError(path, problem)
    for match in matches:
        assert match is not None
        module = module_path(module, int(match.group(1)), match.group(2))
    name = parts[-1].split("_", 1)[1]
    hi, lo, mean, norm = values
    nan = int(any(math.isnan(v) for v in values))
    stats = TensorStats(
        max=hi, min=lo, mean=mean, norm=norm, nan_count=nan,
        posinf_count=int(not nan and hi == math.inf), neginf_count=int(not nan and lo == -math.inf),
        numel=math.prod(shape),
    )  # fmt: skip
    kind = kind_of(name, has_children)
    return Record(
        name=f"{kind}.{module}.{name}.forward.0",
        slot=_slot(row["stage"], row["io"], index),
        kind=kind,
        op=name,
        module=module,
        dtype=DTYPES[code],
        shape=shape,
        stats=stats,
        rank=device,
        step=round_,
    )
