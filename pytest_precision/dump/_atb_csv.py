"""``statistic.csv``, the per-round table atb_probe writes for every saved tensor.

15 columns, unquoted, the first row the names (``STAT_COLUMNS``); one row per tensor, in the
order atb_probe's writer threads finish, so not execution order. The statistics are "N/A" in
the ``tensor`` task and the tensor path is "N/A" in the ``statistics`` task. Column meanings, and
what is verified against msprobe's source: ``docs/atb.md``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .._errors import DumpFormatError
from ..numerics._stats import TensorStats
from ._atb_bin import DTYPES, MKI_DTYPES, MKI_FORMATS, stage_of
from ._json_files import MAX_NESTING

STAT_COLUMNS = (
    "Device and PID", "Execution Count", "Op Name", "Op Type", "Op Id", "Input/Output", "Index",
    "Dtype", "Format", "Shape", "Max", "Min", "Mean", "Norm", "Tensor Path",
)  # fmt: skip
NOT_AVAILABLE = "N/A"
ROOT_NAME = "atb_dump_data"

_PROCESS = re.compile(r"[0-9]+_[0-9]+")
_UNDEFINED = re.compile(r"undefined\(-?[0-9]+\)")
_SHAPE = re.compile(r"[0-9]+(?:x[0-9]+){0,31}")
_NAME = re.compile(r"[^\s/]+")
#: std::to_string's "%f" (and "%d"), nan and inf
_NUMBER = re.compile(r"-?(?:[0-9]+(?:\.[0-9]*)?|nan|inf)")
_IO = {"input": "intensor", "output": "outtensor"}
_TORCH_DTYPES = {MKI_DTYPES[code]: name for code, name in DTYPES.items()}
_Problem = Callable[[str], DumpFormatError]


@dataclass(frozen=True)
class StatRow:
    """One checked row of ``statistic.csv``."""

    number: int
    device: int
    ids: tuple[int, ...]
    names: tuple[str, ...]
    #: ``intensor`` or ``outtensor``, the file name prefix of the tensor
    io: str
    index: int
    #: the torch name of the dtype where this reader loads it, else atb_probe's name
    dtype: str
    format: str
    shape: tuple[int, ...]
    stats: TensorStats | None
    #: whether the row names the tensor's ``.bin`` file (the ``tensor`` and ``all`` tasks)
    has_file: bool


def read_statistics(path: Path, process: str | None, round_name: str) -> list[StatRow]:
    """The rows of ``path``, each checked; ``process`` / ``round_name`` are the folder names
    (``<device>_<pid>`` / ``<round>``) the rows must name (``process`` None: any, the same)."""
    rows: list[StatRow] = []
    try:
        with open(path, encoding="utf-8", newline="") as f:
            lines = (line.removesuffix("\n").removesuffix("\r") for line in f)
            header = next(lines, "")
            if len(header.split(",")) != len(STAT_COLUMNS):
                problem = (
                    f"row 1 must be the {len(STAT_COLUMNS)} column names, found {header[:80]!r}"
                )
                raise DumpFormatError(path, problem)
            for number, line in enumerate(lines, start=2):
                if line and line != header:  # a second header: two writer threads raced
                    row = _row(path, number, line.split(","), process, round_name)
                    process = process or line.partition(",")[0]
                    rows.append(row)
    except (OSError, UnicodeDecodeError) as exc:
        raise DumpFormatError(path, f"cannot be read: {exc}") from None
    return rows


def _row(
    path: Path, number: int, cells: list[str], process: str | None, round_name: str
) -> StatRow:
    def bad(problem: str) -> DumpFormatError:
        return DumpFormatError(path, f"row {number}: {problem}")

    if len(cells) != len(STAT_COLUMNS):
        hint = " (atb_probe writes 18 for a complex tensor's statistics)" * (len(cells) == 18)
        raise bad(f"{len(cells)} columns, expected {len(STAT_COLUMNS)}{hint}")
    device_pid, count, op_name, op_type, op_id, io, index, dtype, fmt, dims = cells[:10]
    if not _PROCESS.fullmatch(device_pid) or device_pid != (process or device_pid):
        raise bad(f"Device and PID {device_pid[:40]!r}, expected {process or '<device>_<pid>'}")
    if count != round_name:
        raise bad(f"Execution Count {count[:40]!r}, but the round folder is {round_name}")
    names = tuple(op_name.split("/"))
    if not all(_NAME.fullmatch(n) for n in names) or len(names) > MAX_NESTING:
        raise bad(f"Op Name {op_name[:60]!r} is not <Name>/<Name>/...")
    if op_type != names[-1]:
        raise bad(f"Op Type {op_type[:40]!r} is not the last name of Op Name {op_name[:60]!r}")
    ids = tuple(op_id.split("_"))
    if len(ids) != len(names) or not all(i.isdecimal() and i.isascii() for i in ids):
        raise bad(f"Op Id {op_id[:60]!r} is not one <id> per name of Op Name, joined by _")
    if io not in _IO or not (index.isdecimal() and index.isascii()):
        raise bad(f"Input/Output {io[:20]!r} and Index {index[:20]!r}: expected input or output, N")
    if dtype not in MKI_DTYPES.values() and not _UNDEFINED.fullmatch(dtype):
        raise bad(f"Dtype {dtype[:40]!r} is not one atb_probe writes (float, float16, bf16, ...)")
    if fmt not in MKI_FORMATS.values() and not _UNDEFINED.fullmatch(fmt):
        raise bad(f"Format {fmt[:40]!r} is not one atb_probe writes (nd, nchw, fractal_nz, ...)")
    if dims and not _SHAPE.fullmatch(dims):
        raise bad(f"Shape {dims[:40]!r} is not <d0>x<d1>x...")
    shape = tuple(int(n) for n in dims.split("x")) if dims else ()
    file = (
        *(f"{i}_{n}" for i, n in zip(ids, names, strict=True)),
        stage_of(_IO[io]),
        f"{_IO[io]}{index}.bin",
    )
    return StatRow(
        number=number,
        device=int(device_pid.partition("_")[0]),
        ids=tuple(int(i) for i in ids),
        names=names,
        io=_IO[io],
        index=int(index),
        dtype=_TORCH_DTYPES.get(dtype, dtype),
        format=fmt,
        shape=shape,
        stats=_stats(cells[10:14], math.prod(shape), bad),
        has_file=_tensor_path(cells[14], (device_pid, count, *file), bad),
    )


def _stats(cells: list[str], numel: int, bad: _Problem) -> TensorStats | None:
    """atb_probe's Max/Min/Mean/Norm: four numbers, or four N/A (no statistics: the ``tensor``
    task, or a dtype atb_probe computes none for). Its max and min skip NaN, its mean and norm
    do not, so a NaN norm means a NaN element and an infinite max / min an infinite one."""
    if cells == [NOT_AVAILABLE] * 4:
        return None
    if not all(_NUMBER.fullmatch(c) for c in cells):
        raise bad(f"Max/Min/Mean/Norm {','.join(cells)[:80]!r}: expected four numbers or four N/A")
    hi, lo, mean, norm = (float(c) for c in cells)
    return TensorStats(
        max=hi, min=lo, mean=mean, norm=norm, nan_count=int(math.isnan(norm)),
        posinf_count=int(hi == math.inf), neginf_count=int(lo == -math.inf), numel=numel,
    )  # fmt: skip


def _tensor_path(cell: str, expected: tuple[str, ...], bad: _Problem) -> bool:
    """Whether the row names a file; it must be ``.../atb_dump_data/data/`` + ``expected``, the
    file atb_probe writes for the row. The part before ``atb_dump_data`` (where the dump was
    written) is ignored, so a moved dump still reads."""
    if cell == NOT_AVAILABLE:
        return False
    parts = cell.split("/")
    if ROOT_NAME not in parts:
        raise bad(f"Tensor Path {cell[-80:]!r} is neither N/A nor in an {ROOT_NAME}/ folder")
    tail = tuple(parts[len(parts) - parts[::-1].index(ROOT_NAME) :])
    if tail != ("data", *expected):
        found = "/".join(tail)[-120:]
        raise bad(f"Tensor Path ends in {found!r}, expected data/{'/'.join(expected)}")
    return True
