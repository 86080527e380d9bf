"""Golden files: one safetensors file per test (where: :mod:`._golden_layout`).

Each value is flattened into tensors keyed ``<name><path>`` (the path as :func:`iter_leaf_pairs`
spells it; an HF KV cache stores its layers' tensors, ``out['cache'].layers[0].keys``, and
loads back as a :class:`StoredCache` that compares as the cache it was), stored in their own
dtype, so every dtype round-trips bit for bit. The header metadata holds the schema version,
the environment of the run that wrote the file, each value's structure (so nested values load
back as the same containers) and, from schema 2 on, each value's noise envelope
(:mod:`._envelope`): a float64 reference is stored as the tensors
``<key>@reference``. Schema 1 files (no envelopes) read as before. One file per test keeps a
write one ``os.replace``: a killed writer leaves the old file or the new one, never a torn one.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import safetensors
import safetensors.torch
import torch

from .._atomic import atomic_write
from .._errors import DumpFormatError, PrecisionInputError
from ..numerics._assertions import to_tensor
from ..numerics._nested import StoredCache, cache_kind, hf_cache_items, is_leaf
from ._layout import METADATA_KEY as _METADATA_KEY
from ._layout import SCHEMA_VERSION

#: A stored float64 reference's key: the golden tensor's key plus this.
REFERENCE_SUFFIX = "@reference"

#: A JSON tree describing one stored value's containers; its leaves name tensors in the file.
Structure = dict[str, Any]


class NewerSchemaError(DumpFormatError):
    """A golden written by a newer pytest-precision: never misread, never overwritten."""


@dataclass(frozen=True)
class Entry:
    """One named value as stored: its structure and the tensors its leaves point at."""

    structure: Structure
    tensors: Mapping[str, torch.Tensor]
    #: How the value's noise was measured (JSON-ready); None: judged by the dtype's default.
    envelope: Mapping[str, Any] | None = None
    #: The float64 reference per tensor key (stored as ``<key>@reference``).
    references: Mapping[str, torch.Tensor] = dataclasses.field(default_factory=dict)

    def all_tensors(self) -> dict[str, torch.Tensor]:
        """Every tensor this value stores, keyed as in the file."""
        return {
            **self.tensors,
            **{f"{key}{REFERENCE_SUFFIX}": t for key, t in self.references.items()},
        }


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
    cache = hf_cache_items(value)
    if cache is not None:  # an HF KV cache: its layers' keys and values, as the walk names them
        fields = [[f, _flatten(v, f"{key}.{f}", tensors)] for f, v in cache]
        return {"cache": cache_kind(value), "fields": fields}
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
        if kind == "cache":
            fields = {f: _unflatten(v, tensors, path) for f, v in node["fields"]}
            return StoredCache(str(body), fields)
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
            path, f"corrupt golden file, not readable as safetensors ({exc})"
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
        envelopes = meta.get("envelopes", {})
        entries = {}
        for name, structure in structures.items():
            keys = list(_tensor_keys(structure))
            envelope = envelopes.get(name)
            if envelope is not None and not isinstance(envelope, dict):
                raise TypeError(f"envelope of {name!r} is not a mapping")
            references = {
                k: tensors[k + REFERENCE_SUFFIX]
                for k in (envelope or {}).get("references", ())
                if k in keys
            }
            entries[name] = Entry(structure, {k: tensors[k] for k in keys}, envelope, references)
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
        for key in entry.all_tensors():
            other = owners.setdefault(key, name)
            if other != name:
                raise PrecisionInputError(
                    f"{path}: golden values {other!r} and {name!r} both store a tensor named "
                    f"{key!r}; rename one of them"
                )


def write_golden(path: Path, entries: Mapping[str, Entry], environment: Mapping[str, str]) -> None:
    """Write a test's golden file in one atomic replace."""
    check_distinct_keys(entries, path)
    tensors = {key: t for entry in entries.values() for key, t in entry.all_tensors().items()}
    meta: dict[str, Any] = {
        "schema": SCHEMA_VERSION,
        "environment": dict(environment),
        "values": {name: entry.structure for name, entry in entries.items()},
    }
    envelopes = {name: dict(e.envelope) for name, e in entries.items() if e.envelope}
    if envelopes:
        meta["envelopes"] = envelopes
    metadata = {_METADATA_KEY: json.dumps(meta, sort_keys=True)}
    atomic_write(path, safetensors.torch.save(tensors, metadata=metadata))
