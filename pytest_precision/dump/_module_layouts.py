"""The layouts of a tensor-parallel layer's weights and output, read from the layer itself.

vLLM's parallel layers (and the Megatron-style layers theirs follow) say how they split the
model in plain attributes: ``tp_rank`` / ``tp_size``, ``output_partition_sizes`` for the
column-parallel ones, ``output_sizes`` for fused ones, the head counts of a q/k/v projection,
``input_is_parallel`` / ``reduce_results`` for a row-parallel one, ``shard_indices`` for a
vocabulary split with padding. They are recognised by those attributes, so no serving engine is
imported here, and the layouts go into the dump with the records of the layer's parameters and
output (``parameters.weight``, ``output.0``); the merge of two parallel layouts carries them to
the other records of the same tensors.
"""

from __future__ import annotations

from typing import Any

import torch

from ._tensor_layouts import LOCAL, PARTIAL, REPLICATED, TensorLayout, shard

#: the slot whose layout is that of every tensor of the op calls inside the layer
INSIDE = "*"
#: ``(start, size, logical_start)`` runs along the split dimension, as in :func:`shard`
Runs = list[tuple[int, int, int]]


def module_layouts(module: Any) -> dict[str, TensorLayout]:
    """Slot (``parameters.weight``, ``output.0``; :data:`INSIDE` for the op calls inside it)
    -> layout, for a layer that is recognised as tensor-parallel; empty for any other module,
    or one whose attributes do not add up."""
    rank, ranks = getattr(module, "tp_rank", None), getattr(module, "tp_size", None)
    if type(rank) is not int or type(ranks) is not int or not 0 <= rank < ranks:
        return {}
    try:
        if hasattr(module, "shard_indices") and hasattr(module, "org_vocab_size"):
            layouts = _vocabulary(module)
        elif hasattr(module, "input_is_parallel") and hasattr(module, "reduce_results"):
            layouts = _row(module, ranks)
        elif hasattr(module, "output_partition_sizes"):
            layouts = _column(module, rank, ranks)
        else:
            return {}
    except (AttributeError, TypeError, ValueError, ZeroDivisionError):
        return {}  # a look-alike: left to the merge's shape rules
    return {slot: layout for slot, layout in layouts.items() if _fits(module, slot, layout)}


def _fits(module: Any, slot: str, layout: TensorLayout) -> bool:
    """Whether a parameter's layout fits the parameter: an engine may swap a weight for a
    packed copy and leave an empty one (vLLM on CPU), which has no layout."""
    kind, _, name = slot.partition(".")
    if kind != "parameters" or layout.how != "shard":
        return True
    param = getattr(module, name, None)
    if not isinstance(param, torch.Tensor) or not -param.dim() <= layout.dim < param.dim():
        return False
    length = param.shape[layout.dim]
    return all(p.start + p.size <= length for p in layout.pieces)


def _column(module: Any, rank: int, ranks: int) -> dict[str, TensorLayout]:
    """Column-parallel: the output features split, rank by rank; a fused layer's parts each
    split that way (gate then up; q, k then v with their heads)."""
    if hasattr(module, "total_num_heads") and hasattr(module, "total_num_kv_heads"):
        size, runs = _qkv(module, rank)
    else:
        parts = [int(n) for n in module.output_partition_sizes]
        totals = [int(n) for n in getattr(module, "output_sizes", [sum(parts) * ranks])]
        if len(totals) != len(parts):
            raise ValueError("output_sizes and output_partition_sizes disagree")
        runs, start = [], 0
        for i, part in enumerate(parts):
            runs.append((start, part, sum(totals[:i]) + rank * part))
            start += part
        size = sum(totals)
    layouts = {"parameters.weight": shard(0, size, runs)}
    if getattr(module, "bias", None) is not None:
        layouts["parameters.bias"] = shard(0, size, runs)
    if getattr(module, "gather_output", False) and ranks > 1:
        layouts["output.0"] = REPLICATED
    else:
        layouts["output.0"] = shard(-1, size, runs)
    return layouts


def _qkv(module: Any, rank: int) -> tuple[int, Runs]:
    """A fused q/k/v projection: rank ``r`` holds its q heads, then its k and v heads. With
    fewer k/v heads than ranks, each is replicated on ``num_kv_head_replicas`` ranks in a row."""
    head, v_head = int(module.head_size), int(getattr(module, "v_head_size", module.head_size))
    heads, kv_heads = int(module.num_heads), int(module.num_kv_heads)
    q_total = int(module.total_num_heads) * head
    k_total = int(module.total_num_kv_heads) * head
    v_total = int(module.total_num_kv_heads) * v_head
    replicas = int(getattr(module, "num_kv_head_replicas", 1))
    first_kv = rank // replicas * kv_heads
    q, k, v = heads * head, kv_heads * head, kv_heads * v_head
    runs = [
        (0, q, rank * q),
        (q, k, q_total + first_kv * head),
        (q + k, v, q_total + k_total + first_kv * v_head),
    ]
    return q_total + k_total + v_total, runs


def _row(module: Any, ranks: int) -> dict[str, TensorLayout]:
    """Row-parallel: the input features split; the output is the ranks' partial sums, added
    by the all-reduce unless ``reduce_results`` is off. Only rank 0 adds the bias."""
    if ranks == 1:
        return {}
    total = int(module.input_size)
    part = int(module.input_size_per_partition)
    rank = int(module.tp_rank)
    weight = shard(-1, total, [(0, part, rank * part)])
    return {
        "parameters.weight": weight,
        "output.0": REPLICATED if module.reduce_results else PARTIAL,
    }


def _vocabulary(module: Any) -> dict[str, TensorLayout]:
    """A vocabulary split between ranks (an embedding, an LM head): rank ``r`` holds its range
    of the original vocabulary, then its range of the added one, each padded; the padding is
    no part of the logical table. Split between ranks, each looks up only the tokens in its
    range (the others' indices masked to 0, their rows zeroed after): its op calls are rank-local
    work that only the layer's output, after its all-reduce, makes whole."""
    shard_indices = module.shard_indices
    org = int(shard_indices.org_vocab_end_index) - int(shard_indices.org_vocab_start_index)
    added = int(shard_indices.added_vocab_end_index) - int(shard_indices.added_vocab_start_index)
    org_padded = int(shard_indices.padded_org_vocab_end_index) - int(
        shard_indices.padded_org_vocab_start_index
    )
    runs = [(0, org, int(shard_indices.org_vocab_start_index))]
    if added:
        runs.append((org_padded, added, int(shard_indices.added_vocab_start_index)))
    size = int(module.org_vocab_size) + int(getattr(module, "num_added_embeddings", 0))
    layouts = {"parameters.weight": shard(0, size, runs)}
    if int(module.tp_size) > 1:
        layouts[INSIDE] = LOCAL
        layouts["output.0"] = REPLICATED  # after its all-reduce
    return layouts
