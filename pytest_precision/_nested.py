"""Flatten nested outputs (tuples, lists, dicts, dataclasses, HF ``ModelOutput``) into leaves.

Comparisons report *where* in a structure a value differs, so every leaf carries a path written
the way a user would index it: ``['logits']``, ``[1][0]``, ``.hidden``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any


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
    if isinstance(value, (tuple, list)):
        for index, item in enumerate(value):
            _walk(item, f"{path}[{index}]", leaves)
    elif isinstance(value, Mapping):
        for key, item in value.items():
            _walk(item, f"{path}[{key!r}]", leaves)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for field in dataclasses.fields(value):
            _walk(getattr(value, field.name), f"{path}.{field.name}", leaves)
    else:
        leaves.append((path, value))
