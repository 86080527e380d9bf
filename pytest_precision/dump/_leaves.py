"""Values as slots: how capture names the tensors inside arguments and outputs.

A call's arguments and outputs become ``(slot, leaf)`` pairs: ``input.0``, ``kwargs.dim``,
``output.0``; containers that hold tensors are opened, one dotted level per container
(``input.0.1`` is the second tensor of a tuple passed first). Capture writes records with these
slots, replay names its recomputed outputs with them so the two pair up.
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Collection, Iterator, Mapping
from typing import Any

import torch

from ..numerics._nested import hf_cache_items

#: Types of values that never hold tensors: no need to look inside them.
_ATOMS = frozenset({type(None), bool, int, float, complex, str, torch.dtype, torch.device})
#: Containers that are never a KV cache: no need to ask.
_PLAIN_CONTAINERS = frozenset({tuple, list, dict})


def _items(value: Any) -> Iterator[tuple[str, Any]] | None:
    """(key, item) pairs of a container (tuple, list, mapping, dataclass, HF KV cache), None
    otherwise. A cache opens into its tensors: ``kwargs.cache.layers.0.keys``."""
    if isinstance(value, (tuple, list)):
        return ((str(i), item) for i, item in enumerate(value))
    if isinstance(value, Mapping):
        return ((str(k), item) for k, item in value.items())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return ((f.name, getattr(value, f.name)) for f in dataclasses.fields(value))
    cache = hf_cache_items(value)
    return None if cache is None else iter(cache)


def has_tensor(value: Any) -> bool:
    """Holds a tensor, or is worth opening as if it did: an HF KV cache counts even while
    empty (the prefill's), so its slots are the same at every step."""
    if isinstance(value, torch.Tensor):
        return True
    if type(value) in _ATOMS:
        return False
    items = _items(value)
    if items is None:
        return False
    if any(has_tensor(item) for _, item in items):
        return True
    return type(value) not in _PLAIN_CONTAINERS and hf_cache_items(value) is not None


def add_leaves(
    leaves: list[tuple[str, Any]],
    slot: str,
    value: Any,
    cache_layers: Collection[int] | None = None,
) -> None:
    """Append (slot, leaf) pairs: containers holding tensors are opened, anything else is a leaf.
    ``cache_layers``: the layers of an HF KV cache to open (None: all of them)."""
    items = None if isinstance(value, torch.Tensor) or not has_tensor(value) else _items(value)
    if items is None:
        leaves.append((slot, value))
        return
    in_cache = cache_layers is not None and type(value) not in _PLAIN_CONTAINERS
    for key, item in items:
        if in_cache and key == "layers" and isinstance(item, (list, tuple)):
            assert cache_layers is not None
            for index, layer in enumerate(item):
                if index in cache_layers:
                    add_leaves(leaves, f"{slot}.layers.{index}", layer)
            continue
        add_leaves(leaves, f"{slot}.{key}", item, cache_layers)


#: module -> the KV-cache layers its attention modules own (None: no ``layer_idx`` inside)
_OWNED_LAYERS: weakref.WeakKeyDictionary[torch.nn.Module, frozenset[int] | None] = (
    weakref.WeakKeyDictionary()
)


def owned_cache_layers(module: torch.nn.Module) -> frozenset[int] | None:
    """The cache layers a module reads: those of the attention modules inside it (HF's
    ``layer_idx``). A decoder layer is handed the whole cache but reads only its own layer, so
    recording the others would make every layer's input differ when one layer's cache does."""
    try:
        return _OWNED_LAYERS[module]
    except KeyError:
        pass
    owned = frozenset(
        index
        for inner in module.modules()
        if isinstance(index := getattr(inner, "layer_idx", None), int)
    )
    _OWNED_LAYERS[module] = owned or None
    return owned or None


def input_leaves(
    args: tuple[Any, ...], kwargs: dict[str, Any], cache_layers: Collection[int] | None = None
) -> list[tuple[str, Any]]:
    """``cache_layers``: as :func:`add_leaves` (a module's own layers, from
    :func:`owned_cache_layers`)."""
    leaves: list[tuple[str, Any]] = []
    for index, arg in enumerate(args):
        if isinstance(arg, torch.Tensor):  # the usual case, without a look inside
            leaves.append((f"input.{index}", arg))
        else:
            add_leaves(leaves, f"input.{index}", arg, cache_layers)
    for key, arg in kwargs.items():
        add_leaves(leaves, f"kwargs.{key}", arg, cache_layers)
    return leaves


def output_leaves(output: Any) -> list[tuple[str, Any]]:
    leaves: list[tuple[str, Any]] = []
    for index, item in enumerate(output if isinstance(output, tuple) else (output,)):
        add_leaves(leaves, f"output.{index}", item)
    return leaves
