"""Simulated tensor-parallel dumps: many ranks, several decode steps, small tensors, written
with the native dump writer record by record (no model runs, no processes per rank).

Each rank at each step runs an embedding (outside every layer), then per layer a row-parallel
projection (``Functional.linear``), an ``all_reduce`` of the ranks' partial sums and a
residual ``Tensor.add``, inside a ``Module.layers.<l>.Block`` call. A planted bug makes one
rank's weight in one layer off (``weight``: a source, at every step) or one rank's residual add
compute wrong at one step (``kernel``: a float64 rerun convicts it)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from pytest_precision import ShardedComparison
from pytest_precision.compare._shards import Shard
from pytest_precision.dump._writer import DumpWriter

TOKENS, HIDDEN, VOCAB = 4, 8, 16


@dataclass(frozen=True)
class Bug:
    kind: str  # "weight" or "kernel"
    rank: int
    layer: int
    step: int = 0  # the kernel bug's step (a weight is wrong at every step)


def write_tp_dump(
    path: Path,
    *,
    ranks: int,
    steps: int,
    layers: int,
    bug: Bug | None = None,
    collective: str = "Distributed.all_reduce",
) -> Path:
    """Write the dump of ``ranks`` ranks at ``steps`` decode steps into ``path``; the all_reduce
    is named ``collective`` (``Torch.all_reduce``, vLLM's ``Custom.vllm.all_reduce``)."""
    weights = _weights(ranks, layers, bug)
    embedding = torch.randn(VOCAB, HIDDEN, generator=torch.Generator().manual_seed(1))
    writers = [
        DumpWriter(path, rank=r, world_size=ranks, info={"level": "mix"}, background=False)
        for r in range(ranks)
    ]
    for writer in writers:
        writer.start()
    for step in range(steps):
        ids = torch.randint(0, VOCAB, (TOKENS,), generator=torch.Generator().manual_seed(step))
        for writer in writers:
            _call(writer, step, "Functional.embedding.0.forward", "embed", None,
                  {"input.0": ids, "input.1": embedding, "output.0": embedding[ids]})  # fmt: skip
        xs = [embedding[ids]] * ranks  # each rank's hidden state
        for layer in range(layers):
            partials = [xs[r] @ weights[r][layer].T for r in range(ranks)]
            total = torch.stack(partials).sum(0)
            for rank, writer in enumerate(writers):
                y = xs[rank] + total
                if bug == Bug("kernel", rank, layer, step):
                    y = y * 1.01
                _layer(
                    writer,
                    step,
                    layer,
                    (xs[rank], weights[rank][layer], partials[rank], total, y),
                    collective,
                )
                xs[rank] = y
    for writer in writers:
        writer.close()
    return path


def _weights(ranks: int, layers: int, bug: Bug | None) -> list[list[torch.Tensor]]:
    scale = (HIDDEN * ranks) ** -0.5
    out = []
    for rank in range(ranks):
        generator = torch.Generator().manual_seed(1000 + rank)
        per_layer = [
            torch.randn(HIDDEN, HIDDEN, generator=generator) * scale for _ in range(layers)
        ]
        out.append(per_layer)
    if bug is not None and bug.kind == "weight":
        out[bug.rank][bug.layer] = out[bug.rank][bug.layer].clone()
        out[bug.rank][bug.layer][3, 5] += 1.0
    return out


def _layer(
    writer: DumpWriter,
    step: int,
    layer: int,
    tensors: tuple[torch.Tensor, ...],
    collective: str,
) -> None:
    x, weight, partial, total, y = tensors
    path = f"layers.{layer}"
    block = f"Module.{path}.Block.forward.0"
    _call(writer, step, block, path, None, {"input.0": x})
    _call(writer, step, f"Functional.linear.{layer}.forward", f"{path}.proj", block,
          {"input.0": x, "input.1": weight, "output.0": partial})  # fmt: skip
    _call(writer, step, f"{collective}.{layer}.forward", path, block,
          {"input.0": partial, "output.0": total})  # fmt: skip
    _call(writer, step, f"Tensor.add.{layer}.forward", path, block,
          {"input.0": x, "input.1": total, "output.0": y})  # fmt: skip
    _call(writer, step, block, path, None, {"output.0": y})


def write_calls(
    path: Path,
    calls: list[tuple[int, str, str | None, dict[str, Any]]],
    *,
    rank: int = 0,
    world_size: int = 1,
) -> Path:
    """Rank ``rank``'s dump of ``calls``: (step, name, module, {slot: tensor or plain value})."""
    writer = DumpWriter(
        path, rank=rank, world_size=world_size, info={"level": "mix"}, background=False
    )
    writer.start()
    for step, name, module, slots in calls:
        _call(writer, step, name, module, None, slots)
    writer.close()
    return path


def _call(
    writer: DumpWriter,
    step: int,
    name: str,
    module: str | None,
    parent: str | None,
    slots: dict[str, Any],
) -> None:
    parts = name.split(".")
    kind, op = parts[:2]
    if kind == "Module":
        op = parts[-3]
    elif kind == "Custom":  # torch.ops.<namespace>.<op>
        op = ".".join(parts[1:3])
    for slot, value in slots.items():
        entry: dict[str, Any] = {
            "name": name,
            "kind": kind,
            "op": op,
            "module": module,
            "parent": parent,
            "step": step,
            "slot": slot,
        }
        if not isinstance(value, torch.Tensor):
            writer.add({**entry, "dtype": None, "shape": None, "value": value})
            continue
        entry.update(dtype=str(value.dtype).removeprefix("torch."), shape=list(value.shape))
        writer.add({**entry, "value": None}, key=f"{step}/{name}/{slot}", tensor=value.clone())


def shard_data(comparison: ShardedComparison, shard: Shard) -> set[str]:
    """The stored data (``rank/shard file/key``) the records of a shard's calls point at."""
    return {
        r.data_id
        for pair in comparison.pairs(shard)
        for call in pair
        for r in call.records
        if r.data_id is not None
    }
