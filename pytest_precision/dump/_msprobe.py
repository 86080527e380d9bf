"""Reader for dumps written by msprobe (``mindstudio-probe``'s ``PrecisionDebugger``).

Layout: ``[stepN/][rankN | rank | proc<pid>/]`` folders, each holding ``dump.json`` (one entry per
call, in the order calls finished), an optional ``construct.json`` (call -> enclosing call) and,
for the tensor task, ``dump_tensor_data/`` with one ``.pt`` (or ``.npy``) file per tensor.
msprobe-PyTorch names module calls ``Module.<path>.<Class>.forward.<n>``; msprobe-MindSpore
writes ``.npy`` and names them ``Cell.<path>.<Class>.forward.<n>``: both are read as modules
(kind ``Module``, the path as the module path), every other call (``Functional.*``,
``Tensor.*``, ``Torch.*``, ``Aten.*``, ``Primitive.*``, ``Mint.*``, ...) as an op.
``dump_data_dir`` inside ``dump.json`` is a path on the recording machine and is ignored: data
files are looked up in the rank folder's own ``dump_tensor_data/`` and must stay inside it.
"""

from __future__ import annotations

import functools
import math
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from .._errors import DumpFormatError
from ..numerics._dtypes import dtype_name
from ..numerics._stats import TensorStats
from ._confine import confine, dump_root, inside
from ._json_files import MAX_NESTING, TOO_DEEP, read_json
from ._readahead import Readahead
from ._records import Dump, Record
from ._safe_io import load_npy, load_pt_tensor

FORMAT = "msprobe"
DATA_DIR = "dump_tensor_data"

_STEP_DIR = re.compile(r"step(\d+)")
_RANK_DIR = re.compile(r"rank(\d*)|proc(\d+)")
#: Call-name prefixes of module calls: msprobe-PyTorch's ``Module``, msprobe-MindSpore's ``Cell``
_MODULE_PREFIXES = ("Module", "Cell")
#: dump.json keys of one call -> slot prefix; other keys (``is_recompute``, ...) carry no values
_SLOT_PREFIXES = {
    "input_args": "input",
    "input_kwargs": "kwargs",
    "input": "input",
    "output": "output",
    "parameters": "parameters",
}
_STAT_KEYS = ("Max", "Min", "Mean", "Norm")
_DATA_SUFFIXES = (".pt", ".npy")


def is_msprobe_dump(path: Path) -> bool:
    """Whether ``path`` is an msprobe dump root, step folder or rank folder (complete or not)."""
    if (path / "dump.json").is_file():
        return True
    children = _subdirs(path)
    if any(_STEP_DIR.fullmatch(d.name) and _rank_dirs(d) for d in children):
        return True
    return any(_RANK_DIR.fullmatch(d.name) and (d / "dump.json").is_file() for d in children)


def read_msprobe_dump(path: Path) -> Dump:
    records: list[Record] = []
    environment: dict[str, Any] = {}
    top = dump_root(path)
    for step, rank, rank_dir in _locate_ranks(path):
        header, rank_records = _read_rank(top, rank_dir, step, rank)
        environment = environment or header
        records.extend(rank_records)
    return Dump(path=path, format=FORMAT, records=records, environment=environment)


def _subdirs(path: Path) -> list[Path]:
    return sorted(d for d in path.iterdir() if d.is_dir())


def _rank_dirs(step_dir: Path) -> list[tuple[int, Path]]:
    """Rank folders of a step with their rank: ``rankN`` is N; ``proc<pid>`` count in pid order."""
    ranks: list[tuple[int, Path]] = []
    procs: list[tuple[int, Path]] = []
    for d in _subdirs(step_dir):
        match = _RANK_DIR.fullmatch(d.name)
        if match is None:
            continue
        if match.group(2) is not None:
            procs.append((int(match.group(2)), d))
        else:
            ranks.append((int(match.group(1) or 0), d))
    ranks.extend((i, d) for i, (_, d) in enumerate(sorted(procs)))
    return sorted(ranks)


def _locate_ranks(path: Path) -> list[tuple[int, int, Path]]:
    """``(step, rank, folder)`` of every rank folder under ``path``, in (step, rank) order."""
    if (path / "dump.json").is_file():
        step_match = _STEP_DIR.fullmatch(path.parent.name)
        step = int(step_match.group(1)) if step_match else 0
        rank_match = _RANK_DIR.fullmatch(path.name)
        rank = int(rank_match.group(1)) if rank_match and rank_match.group(1) else 0
        return [(step, rank, path)]
    step_dirs = [(int(m.group(1)), d) for d in _subdirs(path) if (m := _STEP_DIR.fullmatch(d.name))]
    if not step_dirs:
        return [(0, rank, d) for rank, d in _rank_dirs(path)]
    located: list[tuple[int, int, Path]] = []
    for step, step_dir in sorted(step_dirs):
        rank_dirs = _rank_dirs(step_dir)
        if not rank_dirs:
            raise DumpFormatError(step_dir, "no rank*/proc* folder: incomplete msprobe dump")
        located.extend((step, rank, d) for rank, d in rank_dirs)
    return located


def _read_rank(
    top: Path, rank_dir: Path, step: int, rank: int
) -> tuple[dict[str, Any], list[Record]]:
    """The records of one rank folder, whose files must all resolve inside the dump ``top``."""
    confine(top, rank_dir)
    dump_json = rank_dir / "dump.json"
    if not dump_json.is_file():
        raise DumpFormatError(dump_json, "missing: incomplete msprobe dump")
    confine(top, dump_json)
    content = read_json(dump_json)
    if not isinstance(content, Mapping) or not isinstance(content.get("data"), Mapping):
        raise DumpFormatError(dump_json, 'not an msprobe dump.json: no "data" object')
    construct = _read_construct(top, rank_dir / "construct.json")
    header = {k: content.get(k) for k in ("task", "level", "framework")}
    data_files = _DataFiles(top, rank_dir)
    records: list[Record] = []
    for name, call in content["data"].items():
        if not isinstance(call, Mapping):
            raise DumpFormatError(dump_json, f"entry {name!r} is not a JSON object")
        kind, op, module = _parse_name(name)
        if kind != "Module":
            module = _enclosing_module(name, construct)
        for slot, leaf in _slots(name, call, dump_json):
            records.append(
                _record(
                    data_files,
                    leaf,
                    name=name,
                    slot=slot,
                    kind=kind,
                    op=op,
                    module=module,
                    parent=construct.get(name),
                    rank=rank,
                    step=step,
                )
            )
    return header, records


def _read_construct(top: Path, path: Path) -> dict[str, str | None]:
    if not path.is_file():
        return {}
    confine(top, path)
    content = read_json(path)
    if not isinstance(content, Mapping) or not all(
        isinstance(v, str) or v is None for v in content.values()
    ):
        raise DumpFormatError(path, "not an msprobe construct.json: expected {call: parent call}")
    return dict(content)


def _parse_name(name: str) -> tuple[str, str, str | None]:
    """``kind``, ``op`` and, for modules, the dotted module path of an msprobe call name.

    ``Module.block.fc1.Linear.forward.0`` -> ``("Module", "Linear", "block.fc1")``;
    ``Cell.block.fc1.Dense.forward.0`` -> ``("Module", "Dense", "block.fc1")``;
    ``Functional.linear.0.forward`` -> ``("Functional", "linear", None)``;
    ``Primitive.matmul.MatMul.0.forward`` -> ``("Primitive", "matmul.MatMul", None)``;
    ``Aten.add.Tensor.0.forward`` -> ``("Aten", "add.Tensor", None)``.
    """
    parts = name.split(".")
    if parts[0] in _MODULE_PREFIXES and len(parts) >= 4:
        return "Module", parts[-3], ".".join(parts[1:-3])
    if len(parts) >= 4 and parts[-1] in ("forward", "backward"):
        return parts[0], ".".join(parts[1:-2]), None
    return parts[0], ".".join(parts[1:]), None


def _enclosing_module(name: str, construct: Mapping[str, str | None]) -> str | None:
    seen = {name}
    parent = construct.get(name)
    while parent is not None and parent not in seen:
        kind, _, module = _parse_name(parent)
        if kind == "Module":
            return module
        seen.add(parent)
        parent = construct.get(parent)
    return None


def _slots(name: str, call: Mapping[str, Any], source: Path) -> list[tuple[str, Any]]:
    """``(slot, leaf)`` for every value of one call; ``parameters_grad`` entries are parameters."""
    found: list[tuple[str, Any]] = []
    if ".parameters_grad" in name:
        for param, value in call.items():
            _walk(f"parameters.{param}", value, found, source)
        return found
    for key, value in call.items():
        prefix = _SLOT_PREFIXES.get(key)
        if prefix is None:
            continue
        if isinstance(value, list) or prefix in ("kwargs", "parameters"):
            _walk(prefix, value, found, source)
        else:
            _walk(f"{prefix}.0", value, found, source)
    return found


def _walk(slot: str, value: Any, found: list[tuple[str, Any]], source: Path) -> None:
    """Leaves of nested argument lists and dicts, without recursion (depth is bounded)."""
    stack: list[tuple[str, Any, int]] = [(slot, value, 0)]
    while stack:
        slot, value, depth = stack.pop()
        if depth > MAX_NESTING:
            raise DumpFormatError(source, f"value {slot.split('.')[0]}...: {TOO_DEEP}")
        if isinstance(value, list):
            items: list[tuple[str, Any]] = [(f"{slot}.{i}", item) for i, item in enumerate(value)]
        elif isinstance(value, Mapping) and not _is_leaf(value):
            items = [(f"{slot}.{key}", item) for key, item in value.items()]
        else:
            found.append((slot, value))
            continue
        stack.extend((s, v, depth + 1) for s, v in reversed(items))


def _is_leaf(value: Mapping[str, Any]) -> bool:
    """A described value (``{"type": ..., ...}``) rather than a container of arguments."""
    return isinstance(value.get("type"), str) or isinstance(value.get("dtype"), str)


def _record(data_files: _DataFiles, leaf: Any, **fields: Any) -> Record:
    where = f"{fields['name']}.{fields['slot']}"
    if not isinstance(leaf, Mapping):
        return Record(value=leaf, **fields)
    if "dtype" not in leaf or "shape" not in leaf:
        return Record(value=leaf.get("value"), **fields)
    shape = leaf["shape"]
    if not isinstance(shape, list) or not all(isinstance(n, int) for n in shape):
        problem = f"record {where}: shape {shape!r} is not a list of ints"
        raise DumpFormatError(data_files.dump_json, problem)
    dtype = _dtype(leaf["dtype"])
    loader = None
    data_name = leaf.get("data_name")
    if data_name is not None:
        file = data_files.file(data_name, where)
        data_files.readahead.add(file, math.prod(shape) * _itemsize(dtype))
        loader = functools.partial(_load, file, dtype, tuple(shape), data_files.readahead)
    checksum = leaf.get("md5")
    return Record(
        dtype=dtype,
        shape=tuple(shape),
        stats=_stats(leaf, math.prod(shape)),
        loader=loader,
        checksum=checksum if isinstance(checksum, str) else None,
        **fields,
    )


def _itemsize(dtype: str) -> int:
    """Bytes per element of a recorded dtype; 4 for a name torch does not know (the size
    only paces the readahead)."""
    known = getattr(torch, dtype, None)
    return known.itemsize if isinstance(known, torch.dtype) else 4


def _dtype(recorded: Any) -> str:
    """``torch.bfloat16`` (PyTorch) or ``BFloat16`` (MindSpore) -> ``bfloat16``."""
    name = str(recorded).removeprefix("torch.").removeprefix("mindspore.")
    return name if name.islower() else name.lower()


class _DataFiles:
    """One rank folder's ``dump_tensor_data/``, listed once so each record costs no system call."""

    def __init__(self, top: Path, rank_dir: Path) -> None:
        self.dump_json = rank_dir / "dump.json"
        self.folder = rank_dir / DATA_DIR
        #: the data files in the order the records name them, read ahead of the comparison
        self.readahead = Readahead()
        if os.path.lexists(self.folder):
            # the folder itself: a file in it, or resolved against it, is then inside the dump
            confine(top, self.folder)
        try:
            with os.scandir(self.folder) as entries:
                self.listing = {e.name: e.is_symlink() for e in entries if e.is_file()}
        except FileNotFoundError:
            self.listing = {}

    def file(self, data_name: Any, where: str) -> Path:
        """The data file named by ``data_name``, after checking it exists inside the folder."""
        if not isinstance(data_name, str) or not data_name:
            problem = f"record {where}: data_name {data_name!r} is not a name"
            raise DumpFormatError(self.dump_json, problem)
        file = self.folder / data_name
        if data_name in self.listing:
            inside = not self.listing[data_name] or self._contains(file)
        else:  # not a plain file name of the folder: a path, "..", or a missing file
            relative = Path(data_name)
            inside = not relative.is_absolute() and ".." not in relative.parts
            inside = inside and self._contains(file)
        if not inside:
            raise DumpFormatError(
                self.dump_json,
                f"record {where}: data_name {data_name!r} points outside {self.folder}",
            )
        if file.suffix not in _DATA_SUFFIXES:
            problem = f"record {where}: unsupported data file {data_name!r}"
            raise DumpFormatError(self.dump_json, problem)
        if data_name not in self.listing and not file.is_file():
            raise DumpFormatError(file, f"missing: data file of record {where} in {self.dump_json}")
        return file

    def _contains(self, file: Path) -> bool:
        return inside(dump_root(self.folder), file)


def _stats(leaf: Mapping[str, Any], numel: int) -> TensorStats | None:
    """msprobe's Max/Min/Mean/Norm; nan/inf counts only say whether any exist (see docs)."""
    try:
        hi, lo, mean, norm = (_number(leaf.get(key)) for key in _STAT_KEYS)
    except (TypeError, ValueError):
        return None  # bool and empty tensors have no mean/norm; statistics were skipped
    # msprobe's max/min propagate NaN and reach +-inf, so finite statistics mean no NaN/inf.
    nan = int(any(math.isnan(v) for v in (hi, lo, mean, norm)))
    posinf = int(not nan and hi == math.inf)
    neginf = int(not nan and lo == -math.inf)
    return TensorStats(
        max=hi,
        min=lo,
        mean=mean,
        norm=norm,
        nan_count=nan,
        posinf_count=posinf,
        neginf_count=neginf,
        numel=numel,
    )


def _number(value: Any) -> float:
    if isinstance(value, bool) or value is None:
        raise TypeError(value)
    return float(value)


def _load(file: Path, dtype: str, shape: tuple[int, ...], readahead: Readahead) -> torch.Tensor:
    readahead.reading(file)
    if file.suffix == ".npy":
        tensor = load_npy(file)
        if dtype == "bfloat16" and tensor.dtype == torch.float32:
            # MindSpore's msprobe widens bfloat16 to float32 for .npy; narrowing back is exact
            tensor = tensor.to(torch.bfloat16)
    else:
        tensor = load_pt_tensor(file)
    if dtype_name(tensor.dtype) != dtype or tuple(tensor.shape) != shape:
        raise DumpFormatError(
            file,
            f"holds {dtype_name(tensor.dtype)} {list(tensor.shape)}, "
            f"dump.json records {dtype} {list(shape)}",
        )
    return tensor
