"""Reader for MindSpore graph-mode framework dumps (``MINDSPORE_DUMP_CONFIG``, ``e2e_dump``).

Layout: ``rank_<r>/<net>/<graph_id>/<iteration>/`` holding one ``.npy`` per tensor, named
``{op_type}.{op_name}.{task}.{stream}.{timestamp}.{input|output}.{slot}.{format}.{dtype}.npy``,
and ``rank_<r>/execution_order/ms_execution_order_graph_<graph_id>.csv`` (the kernels' full
scope names in execution order). ``op_name`` is the scope with ``/`` written as ``_``
(``Default_block-Block_fc1-Dense_MatMul-op0``); the scope is recovered from the execution order
file, else from the name itself (a segment ends at a ``-<Class>`` / ``-op<N>`` token).
Details: ``docs/mindspore.md``.
"""

from __future__ import annotations

import csv
import functools
import re
from pathlib import Path

import torch

from .._errors import DumpFormatError
from ._confine import confine, dump_root
from ._records import Dump, Record
from ._safe_io import load_npy, npy_dtype_name, npy_header

FORMAT = "mindspore"
_RANK_DIR = re.compile(r"rank_(\d+)")
_ORDER_FILE = re.compile(r"ms_execution_order_graph_(\d+)\.csv")
#: MindSpore's dtype names in file names -> record dtype names
DTYPES = {
    "Float16": "float16",
    "Float32": "float32",
    "Float64": "float64",
    "BFloat16": "bfloat16",
    "Int8": "int8",
    "Int16": "int16",
    "Int32": "int32",
    "Int64": "int64",
    "UInt8": "uint8",
    "UInt16": "uint16",
    "UInt32": "uint32",
    "UInt64": "uint64",
    "Bool": "bool",
}


def is_mindspore_dump(path: Path) -> bool:
    """A folder of ``rank_<r>/`` folders, or one ``rank_<r>/`` folder, holding net folders."""
    return bool(_rank_dirs(path))


def _subdirs(path: Path) -> list[Path]:
    try:
        return sorted(d for d in path.iterdir() if d.is_dir() and not d.is_symlink())
    except OSError:
        return []


def _is_rank(path: Path) -> bool:
    if not _RANK_DIR.fullmatch(path.name):
        return False
    nets = [d for d in _subdirs(path) if d.name not in ("execution_order", "graphs")]
    return any(g.name.isdigit() for net in nets for g in _subdirs(net))


def _rank_dirs(path: Path) -> list[tuple[int, Path]]:
    if _is_rank(path):
        match = _RANK_DIR.fullmatch(path.name)
        assert match is not None
        return [(int(match.group(1)), path)]
    found = []
    for d in _subdirs(path):
        match = _RANK_DIR.fullmatch(d.name)
        if match and _is_rank(d):
            found.append((int(match.group(1)), d))
    return sorted(found)


def read_mindspore_dump(path: Path) -> Dump:
    ranks = _rank_dirs(path)
    if not ranks:
        raise DumpFormatError(path, "not a MindSpore dump: no rank_<r>/<net>/<graph>/ folders")
    steps: dict[tuple[int, int], list[Record]] = {}
    top = dump_root(path)
    for rank, rank_dir in ranks:
        for net in _subdirs(rank_dir):
            if net.name in ("execution_order", "graphs"):
                continue
            for graph in _subdirs(net):
                if not graph.name.isdigit():
                    continue
                order = _execution_order(top, rank_dir, int(graph.name))
                for iteration in _subdirs(graph):
                    if not iteration.name.isdigit():
                        continue
                    records = _read_iteration(top, iteration, order, rank, int(iteration.name))
                    steps.setdefault((int(iteration.name), rank), []).extend(records)
    records = [r for key in sorted(steps) for r in steps[key]]
    return Dump(path=path, format=FORMAT, records=records, environment={"framework": "mindspore"})


def _execution_order(top: Path, rank_dir: Path, graph: int) -> dict[str, tuple[int, str]]:
    """``op_name`` as in file names -> (position, full scope name), from the order file."""
    file = rank_dir / "execution_order" / f"ms_execution_order_graph_{graph}.csv"
    if not file.is_file():
        return {}
    confine(top, file)
    try:
        with open(file, encoding="utf-8", newline="") as f:
            rows = list(csv.reader(f))
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise DumpFormatError(file, f"cannot be read as CSV: {exc}") from None
    if not rows or rows[0] != ["NodeExecutionOrder-FullNameWithScope"]:
        raise DumpFormatError(file, "first row must be NodeExecutionOrder-FullNameWithScope")
    order: dict[str, tuple[int, str]] = {}
    for number, row in enumerate(rows[1:], start=2):
        if len(row) != 1 or not row[0]:
            raise DumpFormatError(file, f"row {number}: expected one scope name")
        order.setdefault(row[0].replace("/", "_"), (len(order), row[0]))
    return order


def parse_file_name(name: str) -> tuple[str, str, str, int, str, int, str, str] | None:
    """``(op_type, op_name, task, stream, io, slot, format, dtype)``; timestamp dropped."""
    parts = name.split(".")
    if len(parts) < 10 or parts[-1] != "npy" or parts[-5] not in ("input", "output"):
        return None
    if not (parts[-4].isdigit() and parts[-6].isdigit() and parts[-7].isdigit()):
        return None
    op_type, op_name = parts[0], ".".join(parts[1:-8])
    task, stream = parts[-8], int(parts[-7])
    return op_type, op_name, task, stream, parts[-5], int(parts[-4]), parts[-3], parts[-2]


def scope_of(op_name: str) -> str:
    """``Default_block-Block_fc1-Dense_MatMul-op0`` ->
    ``Default/block-Block/fc1-Dense/MatMul-op0``: underscores inside a cell's name stay (a
    segment ends at a token holding ``-``)."""
    tokens = op_name.split("_")
    segments: list[str] = []
    current: list[str] = []
    for i, token in enumerate(tokens):
        current.append(token)
        if "-" in token or (i == 0 and token in ("Default", "Gradients")):
            segments.append("_".join(current))
            current = []
    if current:
        segments.append("_".join(current))
    return "/".join(segments)


def module_of(scope: str) -> str:
    """The cell path of a scope: ``Default/block-Block/fc1-Dense/MatMul-op0`` -> ``block.fc1``."""
    segments = scope.split("/")[:-1]
    cells = [s.rsplit("-", 1)[0] for s in segments if s not in ("Default", "Gradients")]
    return ".".join(cells)


def _read_iteration(
    top: Path, folder: Path, order: dict[str, tuple[int, str]], rank: int, step: int
) -> list[Record]:
    calls: dict[tuple[str, str], list[tuple[str, int, str, Path]]] = {}
    first_seen: dict[tuple[str, str], int] = {}
    for file in sorted(folder.iterdir()):
        if file.suffix != ".npy":
            continue
        parsed = parse_file_name(file.name)
        if parsed is None:
            problem = "not a MindSpore dump file name (op.name...io.slot.fmt.dtype)"
            raise DumpFormatError(file, problem)
        op_type, op_name, _, _, io, slot, _, dtype = parsed
        if dtype not in DTYPES:
            raise DumpFormatError(file, f"unknown dtype {dtype!r} in the file name")
        if file.is_symlink():  # folders here are never links (see _subdirs); files may be
            confine(top, file)
        key = (op_type, op_name)
        calls.setdefault(key, []).append((io, slot, dtype, file))
        first_seen.setdefault(key, int(file.name.split(".")[-6]))

    def position(key: tuple[str, str]) -> tuple[int, int, int]:
        if key[0] == "Parameter":  # graph inputs and weights come first
            return (0, 0, first_seen[key])
        known = order.get(key[1])
        return (1, known[0], 0) if known else (2, first_seen[key], 0)

    records: list[Record] = []
    for key in sorted(calls, key=position):
        op_type, op_name = key
        known = order.get(op_name)
        if op_type == "Parameter":
            kind, name, module = "Parameter", f"Parameter.{op_name}", None
        else:
            scope = known[1] if known else scope_of(op_name)
            kind, name, module = "Primitive", scope, module_of(scope)
        for io, slot, dtype, file in sorted(calls[key], key=lambda v: (v[0] != "input", v[1])):
            shape, np_dtype = npy_header(file)
            stored = npy_dtype_name(np_dtype, file)
            expected = DTYPES[dtype]
            if stored != expected and not (expected == "bfloat16" and stored == "float32"):
                raise DumpFormatError(file, f"holds {stored}, the file name says {dtype}")
            records.append(
                Record(
                    name=name,
                    slot=f"{io}.{slot}",
                    kind=kind,
                    op=op_type,
                    module=module,
                    dtype=expected,
                    shape=shape,
                    rank=rank,
                    step=step,
                    loader=functools.partial(_load, file, expected),
                )
            )
    return records


def _load(file: Path, dtype: str) -> torch.Tensor:
    tensor = load_npy(file)
    if dtype == "bfloat16" and tensor.dtype == torch.float32:
        return tensor.to(torch.bfloat16)  # widened from bfloat16 when saved: exact
    return tensor
