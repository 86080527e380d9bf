"""The native dump format: JSON encoding of values, and the reader.

Layout (documented for users in ``docs/dump-format.md``)::

    DUMP/manifest.json                 schema version, environment, ranks, steps, complete flag
    DUMP/rank<r>/records.jsonl         one JSON object per record, in execution order
    DUMP/rank<r>/shard-<n>.safetensors tensor data, one safetensors key per stored tensor
    DUMP/rank<r>/rank.json             written last: record count and shard sizes of the rank

A dump counts as complete only when the manifest says so and every listed rank has its
``rank.json``; anything else was cut short and is refused with a message saying what is missing.
The layout and its JSON metadata are read in :mod:`._native_index` (no torch there).
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple, TypeGuard

import torch
from safetensors import safe_open

from .._atomic import atomic_write
from .._errors import DumpFormatError
from ..numerics._stats import TensorStats
from ._json_files import TOO_DEEP
from ._native_index import RANK_DONE, RECORDS, SHARD_PATTERN, rank_dir, read_manifest, read_rank
from ._padding import Padding
from ._records import MEMORY_STATES, Dump, Record, RecordRef
from ._safe_io import load_safetensors_tensor
from ._tensor_layouts import parse_layout

# -- JSON values ---------------------------------------------------------------------------------
# Strict JSON has no inf/nan, slices or dtypes; those become one-key objects tagged with "$".


def encode_value(value: Any) -> Any:
    """A JSON-safe form of a non-tensor argument; :func:`decode_value` reverses it."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"$float": repr(value)}
    if isinstance(value, complex):
        return {"$complex": [encode_value(value.real), encode_value(value.imag)]}
    if isinstance(value, (torch.dtype, torch.device, torch.memory_format, torch.layout)):
        return str(value)
    if isinstance(value, (tuple, list)):  # torch.Size included
        return [encode_value(item) for item in value]
    if isinstance(value, slice):
        return {
            "$slice": [
                encode_value(value.start),
                encode_value(value.stop),
                encode_value(value.step),
            ]
        }
    if value is Ellipsis:
        return {"$ellipsis": None}
    if isinstance(value, dict) and all(isinstance(key, str) for key in value):
        return {"$dict": {key: encode_value(item) for key, item in value.items()}}
    # An object's default repr holds its address, which differs from run to run: keep the type.
    return {"$repr": _ADDRESS.sub(">", repr(value))}


#: `` at 0x7f39...>`` at the end of a default ``object.__repr__``
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+>")


def decode_value(value: Any) -> Any:
    """Python values back from :func:`encode_value` (dtypes stay strings like ``torch.float32``)."""
    if isinstance(value, list):
        return [decode_value(item) for item in value]
    if not isinstance(value, dict):
        return value
    if len(value) != 1:
        raise ValueError(f"untagged JSON object {value!r}")
    ((tag, payload),) = value.items()
    if tag == "$float":
        return float(payload)
    if tag == "$complex":
        return complex(decode_value(payload[0]), decode_value(payload[1]))
    if tag == "$slice":
        return slice(*(decode_value(item) for item in payload))
    if tag == "$ellipsis":
        return Ellipsis
    if tag == "$dict":
        return {key: decode_value(item) for key, item in payload.items()}
    if tag == "$repr":
        return payload
    raise ValueError(f"unknown tag {tag!r}")


_STATS_FIELDS = tuple(TensorStats.__dataclass_fields__)


def encode_stats(stats: TensorStats) -> dict[str, Any]:
    return {key: encode_value(getattr(stats, key)) for key in _STATS_FIELDS}


def stats_json(stats: TensorStats) -> str:
    """``json_text(encode_stats(stats))``, faster for the usual case: finite float statistics."""
    floats = (stats.max, stats.min, stats.mean, stats.norm)
    counts = (stats.nan_count, stats.posinf_count, stats.neginf_count, stats.numel)
    # A sum of finite floats that overflows only sends a few records down the general path.
    if (
        set(map(type, floats)) != {float}
        or set(map(type, counts)) != {int}
        or not math.isfinite(sum(floats))
    ):
        return json_text(encode_stats(stats))
    return (
        f'{{"max":{stats.max!r},"min":{stats.min!r},"mean":{stats.mean!r},"norm":{stats.norm!r},'
        f'"nan_count":{stats.nan_count},"posinf_count":{stats.posinf_count},'
        f'"neginf_count":{stats.neginf_count},"numel":{stats.numel}}}'
    )


def decode_stats(data: dict[str, Any]) -> TensorStats:
    if set(map(type, data.values())) <= _PLAIN_NUMBERS:  # the usual case: nothing to decode
        return TensorStats.from_dict(data)
    return TensorStats.from_dict({key: decode_value(item) for key, item in data.items()})


_PLAIN_NUMBERS = {int, float}


_LINE_ENCODER = json.JSONEncoder(allow_nan=False, separators=(",", ":"))


def json_text(value: Any) -> str:
    """Compact strict JSON, as record lines use."""
    return _LINE_ENCODER.encode(value)


def json_members(data: dict[str, Any]) -> str:
    """The members of a non-empty JSON object without its braces: record lines are built from
    such pieces (``"name":"Torch.add.0.forward","slot":"input.0"``)."""
    return _LINE_ENCODER.encode(data)[1:-1]


def write_json_atomic(path: Path, data: dict[str, Any], *, durable: bool = True) -> None:
    """Write ``path`` atomically (strict JSON: no NaN or Infinity); see ``atomic_write``."""
    atomic_write(path, json.dumps(data, indent=1, allow_nan=False).encode(), durable=durable)


def numerics_settings() -> dict[str, Any]:
    """Process settings that change results but are not part of the environment fingerprint."""
    return {
        "seed": torch.initial_seed(),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "cuda_matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
        "num_threads": torch.get_num_threads(),
    }


# -- reading -------------------------------------------------------------------------------------


def read_native_dump(path: Path) -> Dump:
    """Load a native dump; tensors stay on disk until ``Record.load()`` (memory-mapped reads)."""
    root = Path(path)
    manifest = read_manifest(root)
    records: list[Record] = []
    for rank in manifest["ranks"]:
        records.extend(_read_rank(root, rank))
    environment = manifest.get("environment")
    return Dump(
        path=root,
        format="native",
        records=records,
        environment=environment if isinstance(environment, dict) else {},
    )


def _read_rank(root: Path, rank: int) -> list[Record]:
    shard_names, entries = read_rank(root, rank)
    folder = rank_dir(root, rank)
    headers = {name: _Shard(folder / name, _shard_header(folder / name)) for name in shard_names}
    index_path = folder / RECORDS
    return [_record(entry, rank, headers, f"{index_path}:{line}") for line, entry in entries]


class _Shard(NamedTuple):
    path: Path
    #: key -> (dtype, shape) of every tensor in the shard
    tensors: dict[str, tuple[str, list[int]]]


def _shard_header(shard: Path) -> dict[str, tuple[str, list[int]]]:
    """Key -> (dtype, shape) of every tensor in ``shard``, read from its header only."""
    try:
        with safe_open(shard, framework="pt") as handle:
            header = {}
            for key in handle.keys():  # noqa: SIM118 (safe_open handles are not mappings)
                piece = handle.get_slice(key)
                header[key] = (piece.get_dtype(), list(piece.get_shape()))
            return header
    except Exception as exc:  # safetensors raises its own error types for bad headers
        raise DumpFormatError(shard, f"unreadable safetensors file: {exc}") from None


def _is_shape(shape: object) -> TypeGuard[list[int]]:
    return isinstance(shape, list) and all(type(size) is int and size >= 0 for size in shape)


def _record(
    entry: dict[str, Any],
    rank: int,
    headers: dict[str, _Shard],
    where: str,
) -> Record:
    try:
        stats = None if entry.get("stats") is None else decode_stats(entry["stats"])
        real_stats = None if entry.get("real_stats") is None else decode_stats(entry["real_stats"])
        value = decode_value(entry.get("value"))
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise DumpFormatError(where, f"malformed value or statistics: {exc}") from None
    except RecursionError:
        raise DumpFormatError(where, f"value or statistics {TOO_DEEP}") from None
    dtype = entry.get("dtype")
    shape = entry.get("shape")
    if shape is not None and not _is_shape(shape):
        raise DumpFormatError(where, f"malformed shape {shape!r}")
    stride = entry.get("stride")
    if stride is not None and (shape is None or not _is_shape(stride) or len(stride) != len(shape)):
        raise DumpFormatError(where, f"malformed stride {stride!r}")
    memory = entry.get("memory")
    if memory is not None and memory not in MEMORY_STATES:
        raise DumpFormatError(where, f"malformed memory {memory!r}")
    changed_since = _record_ref(entry.get("changed_since"), where)
    padding = None
    if entry.get("padding") is not None:
        try:
            padding = Padding.from_json(entry["padding"])
        except ValueError as exc:
            raise DumpFormatError(where, str(exc)) from None
    loader = data_id = None
    if entry.get("data") is not None:
        loader = _loader(entry["data"], dtype, shape, headers, where)
        data_id = f"{rank}/{entry['data']['shard']}/{entry['data']['key']}"
    return Record(
        name=entry["name"],
        slot=entry["slot"],
        kind=entry["kind"],
        op=entry["op"],
        module=entry.get("module"),
        parent=entry.get("parent"),
        dtype=dtype,
        shape=None if shape is None else tuple(shape),
        stats=stats,
        value=value,
        rank=rank,
        step=entry["step"],
        loader=loader,
        data_id=data_id,
        stride=None if stride is None else tuple(stride),
        memory=memory,
        changed_since=changed_since,
        layout=parse_layout(entry.get("layout"), where),
        padding=padding,
        real_stats=real_stats,
    )


def _record_ref(value: object, where: str) -> RecordRef | None:
    """A record's ``changed_since``: ``{"name": str, "slot": str, "step": int}`` or absent."""
    if value is None:
        return None
    if (
        not isinstance(value, dict)
        or not isinstance(value.get("name"), str)
        or not isinstance(value.get("slot"), str)
        or type(value.get("step")) is not int
    ):
        raise DumpFormatError(where, f"malformed changed_since {value!r}")
    return RecordRef(value["name"], value["slot"], value["step"])


def _loader(
    data: object,
    dtype: object,
    shape: object,
    headers: dict[str, _Shard],
    where: str,
) -> Callable[[], torch.Tensor]:
    if not isinstance(data, dict) or not isinstance(data.get("key"), str):
        raise DumpFormatError(where, f"malformed data location {data!r}")
    shard_name, key, raw = data.get("shard"), data["key"], bool(data.get("bytes"))
    if not isinstance(shard_name, str) or not SHARD_PATTERN.fullmatch(shard_name):
        raise DumpFormatError(where, f"data location {shard_name!r} points outside the dump folder")
    shard = headers.get(shard_name)
    if shard is None:
        raise DumpFormatError(where, f"shard {shard_name} is not listed in {RANK_DONE}")
    if key not in shard.tensors:
        raise DumpFormatError(shard.path, f"has no tensor {key!r} (needed by {where})")
    if not isinstance(dtype, str) or not isinstance(getattr(torch, dtype, None), torch.dtype):
        raise DumpFormatError(where, f"unknown dtype {dtype!r}")
    if not _is_shape(shape):
        raise DumpFormatError(where, f"malformed shape {shape!r}")
    target: torch.dtype = getattr(torch, dtype)
    stored_dtype, stored_shape = shard.tensors[key]
    expected_numel = math.prod(shape) * (target.itemsize if raw else 1)
    if math.prod(stored_shape) != expected_numel:
        raise DumpFormatError(
            shard.path,
            f"tensor {key!r} has shape {stored_shape} ({stored_dtype}), "
            f"the record {where} says {shape} ({dtype})",
        )
    # A partial sharing the shard's path, not a closure: a dump holds one loader per stored
    # tensor, and a closure's cells and a path each are that many more objects for the garbage
    # collector to walk, which cost as much as the rest of reading the index.
    return functools.partial(_load, shard.path, key, target, tuple(shape), raw)


def _load(
    shard: Path, key: str, dtype: torch.dtype, shape: tuple[int, ...], raw: bool
) -> torch.Tensor:
    tensor = load_safetensors_tensor(shard, key)
    if raw:  # dtypes safetensors cannot store travel as their bytes
        tensor = tensor.view(dtype)
    return tensor.reshape(shape)
