"""Golden files: one safetensors file per test, named after its node id, written atomically.

Layout: ``<golden-dir>/pytest-precision-goldens.json`` marks the directory, and the test
``tests/test_model.py::TestX::test_y[bf16-2]`` keeps all its values in
``<golden-dir>/tests/test_model/TestX/test_y[bf16-2].safetensors``. Each value is flattened into
tensors keyed ``<name><path>`` (the path as :func:`iter_leaf_pairs` spells it), stored in their
own dtype, so every dtype round-trips bit for bit. The header metadata holds the schema version,
the environment of the run that wrote the file and each value's structure, so nested values
load back as the same containers. One file per test keeps a write one ``os.replace``: a killed
writer leaves the old file or the new one, never a torn one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import re
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import safetensors
import safetensors.torch
import torch

from ._assertions import to_tensor
from ._errors import DumpFormatError, PrecisionInputError
from ._nested import is_leaf

#: Bumped when the file layout changes; a file with a newer schema is refused, not misread.
SCHEMA_VERSION = 1
SUFFIX = ".safetensors"
MARKER = "pytest-precision-goldens.json"
_METADATA_KEY = "pytest_precision.golden"
_TEMP_SUFFIX = ".tmp"

_UNSAFE = re.compile(r"[^A-Za-z0-9_.=+,@()\[\]-]")
_MAX_PART = 100

#: A JSON tree describing one stored value's containers; its leaves name tensors in the file.
Structure = dict[str, Any]


def _safe_part(part: str, max_len: int = _MAX_PART) -> str:
    """One path component: readable, filesystem-safe, at most ``max_len`` characters, and
    distinct whenever the input differs."""
    safe = _UNSAFE.sub("_", part)
    if safe in ("", ".", ".."):
        safe = "_" * max(len(safe), 1)
    if safe != part or len(safe) > max_len:
        digest = hashlib.sha1(part.encode("utf-8")).hexdigest()[:8]
        safe = f"{safe[: max_len - 9]}-{digest}"
    return safe


def _split_nodeid(nodeid: str) -> list[str]:
    bracket = nodeid.find("[")
    head, params = (nodeid, "") if bracket < 0 else (nodeid[:bracket], nodeid[bracket:])
    file, *names = head.split("::")
    parts = file.split("/")
    parts[-1] = parts[-1].removesuffix(".py")
    parts += names
    parts[-1] += params
    return parts


def golden_relpath(nodeid: str) -> PurePosixPath:
    """Where a test's golden file lives, relative to the golden directory.

    ``tests/test_model.py::TestX::test_y[bf16-2]`` -> ``tests/test_model/TestX/test_y[bf16-2]``
    plus :data:`SUFFIX`. Characters outside ``A-Z a-z 0-9 _ . = + , @ ( ) [ ] -`` become ``_``
    and such a component gets a short hash of the original, so two ids never share a file.
    """
    *folders, name = _split_nodeid(nodeid)
    parts = [*(_safe_part(p) for p in folders), _safe_part(name, _MAX_PART - len(SUFFIX))]
    parts[-1] += SUFFIX
    return PurePosixPath(*parts)


def golden_scope(relative: PurePosixPath) -> PurePosixPath:
    """The golden folder holding the goldens of every test under a rootdir-relative path."""
    if str(relative) == ".":
        return relative
    parts = list(relative.parts)
    parts[-1] = parts[-1].removesuffix(".py")
    return PurePosixPath(*(_safe_part(p) for p in parts))


class NewerSchemaError(DumpFormatError):
    """A golden written by a newer pytest-precision: never misread, never overwritten."""


@dataclass(frozen=True)
class Entry:
    """One named value as stored: its structure and the tensors its leaves point at."""

    structure: Structure
    tensors: Mapping[str, torch.Tensor]


def flatten(value: Any, name: str) -> Entry:
    """Detach ``value`` into CPU tensors (copies, so later in-place edits do not leak in)."""
    tensors: dict[str, torch.Tensor] = {}
    structure = _flatten(value, name, tensors)
    return Entry(structure, tensors)


def _flatten(value: Any, key: str, tensors: dict[str, torch.Tensor]) -> Structure:
    if value is None:
        return {"none": None}
    if is_leaf(value):
        t = to_tensor(value, key).detach()
        tensors[key] = t.to("cpu").clone(memory_format=torch.contiguous_format)
        return {"tensor": key}
    if isinstance(value, Mapping):
        items = []
        for k, v in value.items():
            if not isinstance(k, (str, int, float, bool)):
                raise PrecisionInputError(
                    f"{key}: cannot store a dict key of type {type(k).__name__} in a golden "
                    "(keys must be str, int, float or bool)"
                )
            items.append([k, _flatten(v, f"{key}[{k!r}]", tensors)])
        return {"dict": items}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = [
            [f.name, _flatten(getattr(value, f.name), f"{key}.{f.name}", tensors)]
            for f in dataclasses.fields(value)
        ]
        return {"dataclass": type(value).__name__, "fields": fields}
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        kind = "tuple" if isinstance(value, tuple) else "list"
        return {kind: [_flatten(v, f"{key}[{i}]", tensors) for i, v in enumerate(value)]}
    raise PrecisionInputError(
        f"{key}: cannot store a value of type {type(value).__name__} in a golden "
        "(expected a tensor, numpy array, number, or a tuple/list/dict/dataclass of them)"
    )


def unflatten(entry: Entry, path: Path) -> Any:
    """Rebuild a stored value; a structure that does not fit its tensors is a corrupt file."""
    return _unflatten(entry.structure, entry.tensors, path)


def _unflatten(node: Any, tensors: Mapping[str, torch.Tensor], path: Path) -> Any:
    if not isinstance(node, dict) or not node:
        raise DumpFormatError(path, f"corrupt golden: malformed structure node {node!r}")
    kind, body = next(iter(node.items()))
    try:
        if kind == "none":
            return None
        if kind == "tensor":
            return tensors[body]
        if kind == "dict":
            return {k: _unflatten(v, tensors, path) for k, v in body}
        if kind in ("list", "tuple"):
            children = [_unflatten(v, tensors, path) for v in body]
            return tuple(children) if kind == "tuple" else children
        if kind == "dataclass":
            names = [f for f, _ in node["fields"]]
            cls = dataclasses.make_dataclass(body, names)
            return cls(**{f: _unflatten(v, tensors, path) for f, v in node["fields"]})
    except DumpFormatError:
        raise
    except (KeyError, TypeError, ValueError) as exc:
        raise DumpFormatError(
            path, f"corrupt golden: structure does not match its tensors ({exc!r})"
        ) from None
    raise DumpFormatError(path, f"corrupt golden: unknown structure kind {kind!r}")


@dataclass(frozen=True)
class GoldenFile:
    """The content of one test's golden file."""

    path: Path
    schema: int
    environment: Mapping[str, str]
    entries: Mapping[str, Entry]

    def value(self, name: str) -> Any:
        return unflatten(self.entries[name], self.path)


def read_golden(path: Path) -> GoldenFile:
    """Read and validate a golden file; any problem is a :class:`DumpFormatError` naming it."""
    try:
        with safetensors.safe_open(str(path), framework="pt") as f:
            raw = (f.metadata() or {}).get(_METADATA_KEY)
            tensors = {key: f.get_tensor(key) for key in f.keys()}  # noqa: SIM118
    except OSError:
        raise
    except Exception as exc:  # safetensors reports a damaged file with several error types
        raise DumpFormatError(
            path, f"corrupt golden file, not readable as safetensors ({exc}); re-record it"
        ) from None
    if raw is None:
        raise DumpFormatError(path, "not a pytest-precision golden (no golden metadata)")
    try:
        meta = json.loads(raw)
        schema = int(meta["schema"])
    except (ValueError, KeyError, TypeError) as exc:
        raise DumpFormatError(path, f"corrupt golden metadata ({exc!r})") from None
    if schema > SCHEMA_VERSION:
        raise NewerSchemaError(
            path,
            f"written by a newer pytest-precision (golden schema {schema}; this version reads "
            f"schema {SCHEMA_VERSION} and older): upgrade pytest-precision",
        )
    try:
        structures = meta["values"]
        entries = {
            name: Entry(structure, {k: tensors[k] for k in _tensor_keys(structure)})
            for name, structure in structures.items()
        }
        environment = {str(k): str(v) for k, v in meta.get("environment", {}).items()}
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        raise DumpFormatError(path, f"corrupt golden metadata ({exc!r})") from None
    return GoldenFile(path, schema, environment, entries)


def _tensor_keys(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        if "tensor" in node:
            yield node["tensor"]
        for child in node.values():
            yield from _tensor_keys(child)
    elif isinstance(node, list):
        for child in node:
            yield from _tensor_keys(child)


def check_distinct_keys(entries: Mapping[str, Entry], path: Path) -> None:
    """Values share one tensor namespace (``out`` as a tuple stores ``out[0]``): two values
    claiming the same key would silently overwrite each other, so that is an error."""
    owners: dict[str, str] = {}
    for name, entry in entries.items():
        for key in entry.tensors:
            other = owners.setdefault(key, name)
            if other != name:
                raise PrecisionInputError(
                    f"{path}: golden values {other!r} and {name!r} both store a tensor named "
                    f"{key!r}; rename one of them"
                )


def write_golden(path: Path, entries: Mapping[str, Entry], environment: Mapping[str, str]) -> None:
    """Write a test's golden file in one atomic replace."""
    check_distinct_keys(entries, path)
    tensors = {key: t for entry in entries.values() for key, t in entry.tensors.items()}
    meta = {
        "schema": SCHEMA_VERSION,
        "environment": dict(environment),
        "values": {name: entry.structure for name, entry in entries.items()},
    }
    metadata = {_METADATA_KEY: json.dumps(meta, sort_keys=True)}
    atomic_write(path, safetensors.torch.save(tensors, metadata=metadata))


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to a temp file in the same folder, fsync it, then ``os.replace`` it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=_TEMP_SUFFIX, dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(temp, 0o644)
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise


def mark_golden_dir(directory: Path) -> None:
    """Create the marker that tells a golden directory from a dump."""
    marker = directory / MARKER
    if not marker.exists():
        content = {"format": "pytest-precision goldens", "schema": SCHEMA_VERSION}
        atomic_write(marker, (json.dumps(content) + "\n").encode())


def is_golden_dir(directory: Path) -> bool:
    """A missing or empty folder, or one with the marker, holds goldens (anything else may be a
    dump). Dotfiles and READMEs (a ``.gitkeep`` keeping the folder in git) leave it empty."""
    if not directory.exists():
        return True
    if not directory.is_dir():
        return False
    return (directory / MARKER).exists() or all(_is_placeholder(p) for p in directory.iterdir())


def _is_placeholder(path: Path) -> bool:
    return path.is_file() and (path.name.startswith(".") or path.stem.upper() == "README")


def list_goldens(directory: Path) -> list[PurePosixPath]:
    """Every golden file under ``directory``, relative to it, sorted."""
    return sorted(
        PurePosixPath(p.relative_to(directory).as_posix()) for p in directory.rglob(f"*{SUFFIX}")
    )


def list_stale_temps(directory: Path) -> list[Path]:
    """Temp files left by writers that were killed before their ``os.replace``."""
    return sorted(directory.rglob(f".*{SUFFIX}.*{_TEMP_SUFFIX}"))
