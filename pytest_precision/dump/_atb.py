"""Reader for ATB (MindIE) dumps written by msprobe's ``atb_probe``.

Layout: ``atb_dump_data/data/<device>_<pid>/<round>/<layerId>_<Layer>/<opId>_<Op>/.../``
with ``before/intensor<N>.bin`` (inputs, saved before the op ran), ``after/outtensor<N>.bin``
(outputs) and one ``statistic.csv`` per round listing every saved tensor (with statistics in
the ``statistics`` and ``all`` tasks, with its file in the ``tensor`` and ``all`` tasks).
Layer -> operation -> kernel nesting becomes the module path
(``layers.<layerId>.<opId>_<Op>.<kernelId>_<Kernel>``), so localization works layer first, then
op. Details, and what is verified against msprobe's source: ``docs/atb.md``.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path

from .._errors import DumpFormatError
from ._atb_bin import (
    MKI_FORMATS,
    NODE_DIR,
    TENSOR_FILE,
    BinHeader,
    load_bin,
    mki_name,
    read_bin_header,
    stage_of,
    subdirs,
)
from ._atb_csv import ROOT_NAME, StatRow, read_statistics
from ._confine import confine, dump_root
from ._json_files import MAX_NESTING
from ._records import Dump, Record

FORMAT = "atb"
STATISTICS = "statistic.csv"

_AFTER_EVERYTHING = 1 << 62


def _is_process(name: str) -> bool:
    head, sep, tail = name.partition("_")
    return bool(sep) and head.isdecimal() and tail.isdecimal() and name.isascii()


# -- layout ----------------------------------------------------------------------------------------


def is_atb_dump(path: Path) -> bool:
    """An ``atb_dump_data`` folder, its ``data/``, a ``<device>_<pid>`` or a round folder."""
    return bool(_locate(path))


def _is_round(path: Path) -> bool:
    return (path.name.isdecimal() and path.name.isascii()) and (
        any(NODE_DIR.fullmatch(d.name) for d in subdirs(path)) or (path / STATISTICS).is_file()
    )


def _locate(path: Path) -> list[Path]:
    """The round folders under ``path``, by round, then device."""
    if (path / ROOT_NAME).is_dir():
        path = path / ROOT_NAME
    if path.name == ROOT_NAME and (path / "data").is_dir():
        path = path / "data"
    if _is_round(path):
        return [path]
    processes = (
        [path] if _is_process(path.name) else [d for d in subdirs(path) if _is_process(d.name)]
    )
    rounds = [r for folder in processes for r in subdirs(folder) if _is_round(r)]
    return sorted(rounds, key=lambda r: (int(r.name), int(r.parent.name.partition("_")[0]), str(r)))


def read_atb_dump(path: Path) -> Dump:
    located = _locate(path)
    if not located:
        raise DumpFormatError(path, "not an ATB dump: no <device>_<pid>/<round>/ folders")
    top = dump_root(path)
    records = [record for folder in located for record in _read_round(top, folder)]
    return Dump(path=path, format=FORMAT, records=records, environment={"framework": "atb"})


# -- one round -------------------------------------------------------------------------------------


@dataclass
class _Tensor:
    """One tensor of a round: its file in the tree, its row in ``statistic.csv``, or both."""

    ids: tuple[int, ...]
    names: tuple[str, ...]
    stage: str
    io: str
    index: int
    file: Path | None = None
    row: StatRow | None = None

    @property
    def slot(self) -> str:
        """``before/intensor`` -> ``input``, ``after/outtensor`` -> ``output``; inputs saved
        after the op ran (in-place ops) and outputs before it are ``<stage>_input`` etc."""
        base = "input" if self.io == "intensor" else "output"
        natural = (self.stage, self.io) in (("before", "intensor"), ("after", "outtensor"))
        return f"{base}.{self.index}" if natural else f"{self.stage}_{base}.{self.index}"

    @property
    def order(self) -> tuple[int, ...]:
        """Execution order: an op's inputs, then the ops inside it, then its outputs."""
        stage = -1 if self.stage == "before" else _AFTER_EVERYTHING
        return (*self.ids, stage, int(self.io == "outtensor"), self.index)


def _read_round(top: Path, folder: Path) -> list[Record]:
    """The records of one round folder, which must resolve inside the dump ``top`` (its
    ``atb_dump_data/`` or ``data/`` may be symlinks); op folders are never followed as links."""
    confine(top, folder)
    process = folder.parent.name if _is_process(folder.parent.name) else None
    tensors: dict[tuple[tuple[int, ...], str], _Tensor] = {}
    names: dict[tuple[int, ...], tuple[str, str]] = {}
    _walk(folder, (), (), folder, tensors, names)
    csv_file = folder / STATISTICS
    rows: list[StatRow] = []
    if csv_file.is_file():
        confine(top, csv_file)
        rows = read_statistics(csv_file, process, folder.name)
    _merge_rows(csv_file, rows, tensors, names)
    device = rows[0].device if rows else int(process.partition("_")[0]) if process else 0
    parents = {ids[:-1] for ids in names}
    return [
        _record(t, folder, device, int(folder.name), t.ids in parents)
        for t in sorted(tensors.values(), key=lambda t: t.order)
    ]


def _name(
    names: dict[tuple[int, ...], tuple[str, str]],
    ids: tuple[int, ...],
    name: str,
    path: Path,
    where: str,
) -> None:
    """Record the name of op ``ids`` (found at ``where``); two names for one op are refused."""
    known, known_where = names.setdefault(ids, (name, where))
    if known != name:
        op = "_".join(map(str, ids))
        problem = f"op {op} is named {name!r} here, but {known!r} in {known_where}"
        raise DumpFormatError(path, f"{where}: {problem}" if where != str(path) else problem)


def _walk(
    folder: Path,
    ids: tuple[int, ...],
    op_names: tuple[str, ...],
    root: Path,
    tensors: dict[tuple[tuple[int, ...], str], _Tensor],
    names: dict[tuple[int, ...], tuple[str, str]],
) -> None:
    """The ``.bin`` files of the op folders under ``folder`` (op ``ids``), depth first."""
    if len(ids) > MAX_NESTING:
        raise DumpFormatError(folder, f"ops nested more than {MAX_NESTING} levels deep")
    for stage in ("before", "after") if ids else ():
        if os.path.lexists(folder / stage):
            confine(dump_root(root), folder / stage)
        for file in _files(folder / stage):
            match = TENSOR_FILE.fullmatch(file.name)
            if not match:
                continue
            if file.is_symlink():  # op folders are never links (see subdirs); files may be
                confine(dump_root(root), file)
            t = _Tensor(ids, op_names, stage, match.group(1), int(match.group(2)), file=file)
            tensors[t.ids, t.slot] = t
    for child in subdirs(folder):
        match = NODE_DIR.fullmatch(child.name)
        if match:
            child_ids = (*ids, int(match.group(1)))
            _name(names, child_ids, match.group(2), child, str(child))
            _walk(child, child_ids, (*op_names, match.group(2)), root, tensors, names)


def _files(folder: Path) -> list[Path]:
    try:
        return sorted(f for f in folder.iterdir() if not f.is_dir())
    except OSError:
        return []


def _merge_rows(
    csv_file: Path,
    rows: list[StatRow],
    tensors: dict[tuple[tuple[int, ...], str], _Tensor],
    names: dict[tuple[int, ...], tuple[str, str]],
) -> None:
    """Attach each row to the tensor file it describes, or add it as a statistics-only tensor.
    A file with no row stays (atb_probe drops rows, see docs/atb.md); a row naming a file that
    is not there is refused."""
    seen: dict[tuple[tuple[int, ...], str], int] = {}
    for row in rows:
        for depth in range(1, len(row.ids) + 1):
            _name(names, row.ids[:depth], row.names[depth - 1], csv_file, f"row {row.number}")
        t = _Tensor(row.ids, row.names, stage_of(row.io), row.io, row.index, row=row)
        key = (t.ids, t.slot)
        if key in seen:
            raise DumpFormatError(csv_file, f"row {row.number} repeats row {seen[key]}")
        seen[key] = row.number
        if key in tensors:
            tensors[key].row = row
        elif row.has_file:
            problem = f"row {row.number}: its Tensor Path is not in the round folder"
            raise DumpFormatError(csv_file, problem)
        else:
            tensors[key] = t


def _record(t: _Tensor, root: Path, device: int, round_: int, has_children: bool) -> Record:
    module = ""
    for node_id, name in zip(t.ids, t.names, strict=True):
        module = f"layers.{node_id}" if not module else f"{module}.{node_id}_{name}"
    op = t.names[-1]
    kind = "Module" if has_children else "Kernel" if op.endswith("Kernel") else "Operation"
    header = None
    if t.file is not None:
        header = read_bin_header(t.file, root)
        if t.row is not None:
            _agree(header, t.row, t.file)
    dtype = header.dtype if header else t.row.dtype if t.row else None
    shape = header.shape if header else t.row.shape if t.row else None
    data = header.data_file if header else None
    return Record(
        name=f"{kind}.{module}.{op}.forward.0",
        slot=t.slot,
        kind=kind,
        op=op,
        module=module,
        dtype=dtype,
        shape=shape,
        stats=t.row.stats if t.row else None,
        rank=device,
        step=round_,
        loader=None if header is None or data is None else functools.partial(load_bin, header),
        data_id=None if data is None else str(data),
    )


def _agree(header: BinHeader, row: StatRow, file: Path) -> None:
    """A row and the file it names describe the same tensor."""
    said = (row.dtype, row.shape, row.format)
    found = (header.dtype, header.shape, mki_name(header.format, MKI_FORMATS))
    if said != found:
        problem = f"dtype, shape and format {found} disagree with {STATISTICS} row {row.number}"
        raise DumpFormatError(file, f"{problem}: {said}")
