"""Human-readable summaries of a dump: what ``pytest-precision inspect`` prints."""

from __future__ import annotations

import fnmatch
import math
import os
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path

from .._text import shown, shown_text
from ..dump._records import Dump, Record
from ..runtime._devices import flat_fingerprint

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def summarize(dump: Dump) -> str:
    """Format, ranks, steps, record counts by kind, dtypes and size on disk, one per line;
    what the dump says (environment, kinds, dtypes) shown with control characters escaped."""
    records = list(dump)
    loadable = sum(r.loader is not None for r in records)
    stats_only = sum(r.is_tensor and r.loader is None for r in records)
    details = ", ".join(
        f"{shown(k)} {shown(v)}"
        for k, v in dump.environment.items()
        if v is not None and not isinstance(v, (dict, list))
    )
    size, files = _disk_usage(dump.path)
    lines = [
        ("dump", shown(dump.path)),
        ("format", f"{dump.format} ({details})" if details else dump.format),
        ("ranks", _numbers(r.rank for r in records)),
        ("steps", _numbers(r.step for r in records)),
        (
            "records",
            f"{len(records)} ({loadable} tensors with data, {stats_only} statistics only, "
            f"{len(records) - loadable - stats_only} other values)",
        ),
        ("by kind", _counts(r.kind for r in records)),
        ("dtypes", _counts(r.dtype for r in records if r.dtype is not None)),
        ("size", f"{_human_size(size)} on disk ({files} files)"),
    ]
    text = [f"{label + ':':<9} {value}" for label, value in lines]
    nested = {k: v for k, v in dump.environment.items() if isinstance(v, (dict, list))}
    if nested:  # devices, determinism flags, env vars: one line each, not one long dict
        text.append("recorded environment:")
        text += [
            f"  {shown(key)}: {shown(value)}" for key, value in flat_fingerprint(nested).items()
        ]
    return shown_text("\n".join(text))


def list_records(dump: Dump, pattern: str = "*") -> Iterator[str]:
    """One line per record whose name or ``name.slot`` matches the glob ``pattern``, its
    names shown with control characters escaped."""
    matched = [
        r
        for r in dump
        if fnmatch.fnmatchcase(r.name, pattern) or fnmatch.fnmatchcase(r.key, pattern)
    ]
    several = len({(r.rank, r.step) for r in dump}) > 1
    rows = [_row(r, several) for r in matched]
    widths = [max((len(row[i]) for row in rows), default=0) for i in range(4 + several)]
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        yield "  ".join([*cells, *row[len(widths) :]]).rstrip()


def _row(record: Record, with_rank_step: bool) -> list[str]:
    where = [f"rank {record.rank} step {record.step}"] if with_rank_step else []
    shape = "" if record.shape is None else "[" + ", ".join(map(str, record.shape)) + "]"
    if record.stats is not None:
        s = record.stats
        values = f"max={s.max:.6g} min={s.min:.6g} mean={s.mean:.6g} norm={s.norm:.6g}"
    elif record.is_tensor:
        values = ""
    else:
        values = f"value={record.value!r}"
    if record.checksum is not None:
        values += f" checksum={record.checksum}"
    cells = [record.name, record.slot, record.dtype or "-", shape, values.strip()]
    return [*where, *map(shown, cells)]


def _numbers(values: Iterable[int]) -> str:
    return ", ".join(map(str, sorted(set(values)))) or "-"


def _counts(values: Iterable[str]) -> str:
    return ", ".join(f"{shown(k)} {n}" for k, n in Counter(values).most_common()) or "-"


def _disk_usage(path: Path) -> tuple[int, int]:
    if path.is_file():
        return path.stat().st_size, 1
    size = files = 0
    for folder, _, names in os.walk(path):
        for name in names:
            size += os.lstat(os.path.join(folder, name)).st_size
            files += 1
    return size, files


def _human_size(size: int) -> str:
    exponent = min(int(math.log(size, 1024)), len(_UNITS) - 1) if size else 0
    return f"{size} B" if exponent == 0 else f"{size / 1024**exponent:.1f} {_UNITS[exponent]}"
