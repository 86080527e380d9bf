"""The native dump's layout and its JSON metadata, read without torch.

Collecting replay cases needs only which calls a dump holds: this module reads and checks the
manifest, each rank's ``rank.json`` (shards present, sizes as recorded) and ``records.jsonl``
(one JSON object per line, as many as recorded), and leaves tensors and safetensors headers to
the full reader in :mod:`._native`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .._errors import DumpFormatError
from ._confine import confine, dump_root
from ._json_files import TOO_DEEP, read_json_object

FORMAT_NAME = "pytest-precision-dump"
#: Bumped on any change an older reader would misread; readers refuse versions they do not know.
SCHEMA_VERSION = 1
MANIFEST = "manifest.json"
RECORDS = "records.jsonl"
RANK_DONE = "rank.json"
SHARD_PATTERN = re.compile(r"shard-\d{5}\.safetensors")

#: The fields every record line has, with their types.
REQUIRED_FIELDS = {"name": str, "slot": str, "kind": str, "op": str, "step": int}


def rank_dir(root: Path, rank: int) -> Path:
    return root / f"rank{rank}"


def is_native_dump(path: Path) -> bool:
    """Whether ``path`` looks like a native dump, complete or not (the reader says which)."""
    path = Path(path)
    return (path / MANIFEST).is_file() or any(path.glob(f"rank*/{RECORDS}"))


def read_manifest(root: Path) -> dict[str, Any]:
    """The manifest of a complete dump whose schema this version reads."""
    path = root / MANIFEST
    if not path.is_file() and any(root.glob(f"rank*/{RECORDS}")):
        raise DumpFormatError(
            path, "incomplete dump: no manifest (the capture was cut short or is still running)"
        )
    confine(dump_root(root), path)
    manifest = read_json_object(path)
    if manifest.get("format") != FORMAT_NAME:
        raise DumpFormatError(
            path, f"not a pytest-precision dump (format {manifest.get('format')!r})"
        )
    version = manifest.get("schema_version")
    if version != SCHEMA_VERSION:
        raise DumpFormatError(
            path,
            f"unknown schema version {version!r}; this pytest-precision reads version "
            f"{SCHEMA_VERSION} (upgrade pytest-precision to read newer dumps)",
        )
    if manifest.get("complete") is not True:
        raise DumpFormatError(
            path, "incomplete dump: the capture did not finish (cut short by a crash, or running)"
        )
    _int_list(path, manifest, "ranks")
    _int_list(path, manifest, "steps")
    return manifest


def _int_list(path: Path, data: dict[str, Any], key: str) -> list[int]:
    value = data.get(key)
    if not isinstance(value, list) or not all(type(item) is int for item in value):
        raise DumpFormatError(path, f"{key!r} must be a list of integers, got {value!r}")
    return value


def read_rank(root: Path, rank: int) -> tuple[list[str], Iterator[tuple[int, dict[str, Any]]]]:
    """A finalized rank's shard names (each present with its recorded size) and its record
    lines ``(line number, entry)``, each entry checked for :data:`REQUIRED_FIELDS`.

    The lines stream: a reader keeping only what it needs of each entry never holds them all
    (which costs the garbage collector more than parsing them). A record count other than
    ``rank.json``'s raises when the lines run out."""
    folder = rank_dir(root, rank)
    top = dump_root(root)
    confine(top, folder)
    done_path = folder / RANK_DONE
    if not done_path.is_file():
        raise DumpFormatError(
            done_path, f"incomplete dump: rank {rank} never finalized (crashed or still running)"
        )
    confine(top, done_path)
    done = read_json_object(done_path)
    shards = done.get("shards")
    if not isinstance(shards, dict) or not all(type(size) is int for size in shards.values()):
        raise DumpFormatError(done_path, f"'shards' must map file names to sizes, got {shards!r}")
    for name, size in shards.items():
        _check_shard(top, folder, name, size, done_path)
    records = folder / RECORDS
    confine(top, records)
    return list(shards), _read_index(records, done.get("records"))


def _check_shard(top: Path, folder: Path, name: object, size: int, source: Path) -> None:
    if not isinstance(name, str) or not SHARD_PATTERN.fullmatch(name):
        raise DumpFormatError(source, f"shard {name!r} points outside the dump folder")
    shard = folder / name
    if not shard.is_file():
        raise DumpFormatError(shard, "missing shard")
    confine(top, shard)
    actual = shard.stat().st_size
    if actual != size:
        raise DumpFormatError(shard, f"truncated or altered shard: {actual} bytes, expected {size}")


def _read_index(path: Path, expected: object) -> Iterator[tuple[int, dict[str, Any]]]:
    try:
        handle = path.open(encoding="utf-8")
    except FileNotFoundError:
        raise DumpFormatError(path, "missing record index") from None
    number = 0
    with handle:
        lines = enumerate(handle, start=1)
        while True:
            try:
                number, line = next(lines)
            except StopIteration:
                break
            except UnicodeDecodeError as exc:
                raise DumpFormatError(path, f"not UTF-8 text: {exc.reason}") from None
            if not line.endswith("\n"):
                raise DumpFormatError(path, f"line {number}: truncated record")
            try:
                entry = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DumpFormatError(path, f"line {number}: malformed JSON: {exc}") from None
            except RecursionError:
                raise DumpFormatError(path, f"line {number}: {TOO_DEEP}") from None
            if not isinstance(entry, dict):
                raise DumpFormatError(path, f"line {number}: expected a JSON object")
            for key, kind in REQUIRED_FIELDS.items():
                if not isinstance(entry.get(key), kind):
                    raise DumpFormatError(
                        f"{path}:{number}", f"field {key!r} missing or not a {kind.__name__}"
                    )
            yield number, entry
    if number != expected:
        raise DumpFormatError(
            path, f"{number} records, but {RANK_DONE} says {expected!r}: truncated"
        )
