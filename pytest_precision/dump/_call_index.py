"""Which calls a dump holds, without its tensors and, for native dumps, without torch.

Collecting ``replay`` cases needs the op calls of a dump and nothing else; importing torch and
building every record (statistics, loaders, safetensors headers) would cost collection seconds
for 10,000 cases. Native dumps are indexed from their JSON metadata alone: the manifest,
``rank.json``, the shards' sizes and every record line's required fields are checked as the full
reader checks them, dtypes, shapes and data locations when the dump is read in full. Other
layouts go through :func:`~._load.load_dump`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ._json_files import reading_dump
from ._native_index import is_native_dump, read_manifest, read_rank


@dataclass(frozen=True)
class IndexedCall:
    """One recorded call: what names it, and whether any of its values is stored as a tensor
    (not only statistics)."""

    name: str
    kind: str
    step: int
    rank: int
    has_tensors: bool


@dataclass(frozen=True)
class CallIndex:
    """A dump's calls in recording order (the order of :attr:`Dump.calls`)."""

    path: Path
    calls: tuple[IndexedCall, ...]


def call_index(path: str | os.PathLike[str]) -> CallIndex:
    """The calls of the dump at ``path``; a malformed dump raises :class:`DumpFormatError`."""
    root = Path(path)
    if root.is_dir() and is_native_dump(root):
        with reading_dump(root):
            return _native_index(root)
    from ._load import load_dump  # imports torch: other layouts are read in full

    dump = load_dump(root)
    calls = (
        IndexedCall(c.name, c.kind, c.step, c.rank, any(r.loader is not None for r in c.records))
        for c in dump.calls
    )
    return CallIndex(dump.path, tuple(calls))


def _native_index(root: Path) -> CallIndex:
    # (rank, step, name) -> kind, in the order each call's first record came
    kinds: dict[tuple[int, int, str], str] = {}
    stored: set[tuple[int, int, str]] = set()
    for rank in read_manifest(root)["ranks"]:
        for _, entry in read_rank(root, rank)[1]:
            key = (rank, entry["step"], entry["name"])
            kinds.setdefault(key, entry["kind"])
            if entry.get("data") is not None:
                stored.add(key)
    calls = (
        IndexedCall(name, kind, step, rank, (rank, step, name) in stored)
        for (rank, step, name), kind in kinds.items()
    )
    return CallIndex(root, tuple(calls))
