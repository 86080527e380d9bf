"""Walk nested outputs (tuples, lists, dicts, dataclasses, HF ``ModelOutput``): one structure
into its leaves, or two in parallel into leaf pairs.

Comparisons report *where* in a structure a value differs, so every leaf carries a path written
the way a user would index it: ``['logits']``, ``[1][0]``, ``.hidden``.
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from .._errors import PrecisionInputError


def flatten(value: Any) -> list[tuple[str, Any]]:
    """Return the ``(path, leaf)`` pairs of ``value`` in a stable, depth-first order.

    Tuples and lists give ``[i]``, mappings give ``[key!r]`` (an HF ``ModelOutput`` is a mapping of
    its non-``None`` fields, so ``['logits']``), other dataclass instances give ``.field``.
    Anything else (tensors, arrays, numbers, strings, ``None``, opaque objects) is a leaf; a leaf
    at the top has the empty path ``""``.
    """
    leaves: list[tuple[str, Any]] = []
    _walk(value, "", leaves)
    return leaves


def _walk(value: Any, path: str, leaves: list[tuple[str, Any]]) -> None:
    items = children(value)
    if items is None:
        leaves.append((path, value))
        return
    for suffix, item in items:
        _walk(item, path + suffix, leaves)


def children(value: Any) -> Iterator[tuple[str, Any]] | None:
    """(path suffix, child) pairs of a container, or None for anything else.

    Mappings come first, so an HF ``ModelOutput`` (a dict and a dataclass) indexes by key. An
    HF KV cache (``past_key_values``) is an object, not a container: its children are its
    layers and their ``keys`` and ``values`` (``key_cache`` / ``value_cache`` before
    transformers 4.56), so ``['past_key_values'].layers[0].keys``.
    """
    cache = hf_cache_items(value)
    if cache is not None:
        return ((f".{name}", item) for name, item in cache)
    if isinstance(value, Mapping):
        return ((f"[{k!r}]", v) for k, v in value.items())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return ((f".{f.name}", getattr(value, f.name)) for f in dataclasses.fields(value))
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        return ((f"[{i}]", v) for i, v in enumerate(value))
    return None


#: where transformers defines its caches and their layers, and the fields that hold the tensors
#: (an encoder-decoder cache holds two caches, a linear-attention layer its states by index)
_HF_CACHE_MODULE = "transformers.cache_utils"
_HF_CACHE_FIELDS = (
    "layers",
    "keys",
    "values",
    "key_cache",
    "value_cache",
    "self_attention_cache",
    "cross_attention_cache",
    "conv_states",
    "recurrent_states",
)


class StoredCache:
    """A KV cache rebuilt from stored tensors (a golden): it walks and compares as the cache
    type it was stored from, without transformers' class (nor its constructor) to rebuild."""

    def __init__(self, kind: str, fields: dict[str, Any]) -> None:
        self.kind = kind
        self.fields = fields

    def __repr__(self) -> str:
        return f"StoredCache({self.kind}, fields={list(self.fields)})"


#: type -> whether it is an HF cache class (asked once per type: capture asks on every call)
_CACHE_TYPES: dict[type, bool] = {}
_CACHE_TYPES_KEPT = 1024


def _is_hf_cache_type(kind: type) -> bool:
    """A cache or cache layer of transformers, or a model's own subclass of one."""
    known = _CACHE_TYPES.get(kind)
    if known is None:
        if len(_CACHE_TYPES) >= _CACHE_TYPES_KEPT:  # classes made at run time: stay bounded
            _CACHE_TYPES.clear()
        known = _CACHE_TYPES[kind] = any(c.__module__ == _HF_CACHE_MODULE for c in kind.__mro__)
    return known


def _is_hf_cache(value: Any) -> bool:
    return isinstance(value, StoredCache) or _is_hf_cache_type(type(value))


def hf_cache_items(value: Any) -> list[tuple[str, Any]] | None:
    """The ``(field, item)`` pairs that hold an HF KV cache's tensors (its ``layers``, a
    layer's ``keys`` and ``values``), or None when ``value`` is no cache. Capture, goldens and
    comparisons all open a cache through this, so they name its tensors alike."""
    if isinstance(value, StoredCache):
        return list(value.fields.items())
    if not _is_hf_cache_type(type(value)):
        return None
    return [(name, getattr(value, name)) for name in _HF_CACHE_FIELDS if hasattr(value, name)]


def cache_kind(value: Any) -> str:
    """The cache's type name, as stored and compared (``DynamicCache``, ``DynamicLayer``)."""
    return value.kind if isinstance(value, StoredCache) else type(value).__name__


def is_leaf(value: Any) -> bool:
    return isinstance(value, (torch.Tensor, np.ndarray, np.generic, numbers.Number))


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"Tensor{tuple(value.shape)}"
    if _is_hf_cache(value):
        return cache_kind(value)
    if isinstance(value, Mapping):
        return f"{type(value).__name__} with keys {list(value)}"
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        return f"{type(value).__name__} of length {len(value)}"
    return type(value).__name__


def _kind(value: Any) -> str:
    if _is_hf_cache(value):
        return cache_kind(value)
    if isinstance(value, Mapping):
        return "mapping"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return "dataclass"
    return "sequence"


def iter_leaf_pairs(
    actual: Any,
    expected: Any,
    path: str = "",
    *,
    sides: tuple[str, str] = ("actual", "expected"),
) -> Iterator[tuple[str, Any, Any]]:
    """Walk two structures in parallel; yield ``(path, actual_leaf, expected_leaf)``.

    Raises :class:`PrecisionInputError` naming the path where the structures differ (``sides``
    names the two structures in that message), where a value cannot be compared, or where a
    structure contains itself.
    """
    yield from _pairs(actual, expected, path, sides, frozenset())


def _pairs(
    actual: Any, expected: Any, path: str, sides: tuple[str, str], open_ids: frozenset[int]
) -> Iterator[tuple[str, Any, Any]]:
    where = path or "value"
    first, second = sides
    if actual is None and expected is None:
        return
    if is_leaf(actual) and is_leaf(expected):
        yield path, actual, expected
        return
    for value, side in ((actual, first), (expected, second)):
        if value is not None and not is_leaf(value) and children(value) is None:
            raise PrecisionInputError(
                f"{where}: cannot compare a value of type {type(value).__name__} ({side}); "
                "expected a tensor, numpy array, number, or a tuple/list/dict/dataclass of them"
            )
        if id(value) in open_ids:
            raise PrecisionInputError(f"{where}: the {side} structure contains itself")
    a_children, e_children = children(actual), children(expected)
    if a_children is None or e_children is None or _kind(actual) != _kind(expected):
        raise PrecisionInputError(
            f"{where}: structure mismatch: {first} is {_describe(actual)}, "
            f"{second} is {_describe(expected)}"
        )
    a_items, e_items = dict(a_children), dict(e_children)
    if a_items.keys() != e_items.keys():
        missing = [k for k in e_items if k not in a_items]
        extra = [k for k in a_items if k not in e_items]
        raise PrecisionInputError(
            f"{where}: structure mismatch: {first} {_describe(actual)}, "
            f"{second} {_describe(expected)}"
            + (f"; missing in {first}: {', '.join(missing)}" if missing else "")
            + (f"; unexpected in {first}: {', '.join(extra)}" if extra else "")
        )
    inner = open_ids | {id(actual), id(expected)}
    for suffix, e_child in e_items.items():
        yield from _pairs(a_items[suffix], e_child, path + suffix, sides, inner)
