"""Tensor-parallel runs whose layouts capture records, on CPU (gloo), for the tests of the
merge by recorded layouts.

* ``dtensor``: a two-layer MLP stack split by ``torch.distributed.tensor.parallel``
  (``ColwiseParallel`` up projections, ``RowwiseParallel`` down projections): every weight,
  input and output a DTensor with its placements. TP=1 is the same model unsplit.
* ``fused``: a decoder-like stack of layers with the attributes of vLLM's parallel layers (a
  vocabulary-parallel embedding with padding; a fused q/k/v projection with fewer k/v heads
  than ranks, so each rank holds a copy of the k/v head; a fused gate/up projection;
  row-parallel output projections). Concatenating their
  shards in rank order interleaves q, k and v: only the recorded layout merges them right.

Variants plant a wrong element in one rank's piece of layer 1: ``q`` in rank 1's q heads,
``k`` in rank 1's copy of the shared k head, ``up`` in rank 1's shard of the DTensor up
projection.
"""

from __future__ import annotations

import faulthandler
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn import functional

HIDDEN, TOKENS, LAYERS = 16, 5, 2
HEADS, KV_HEADS, HEAD = 4, 1, 4
INTER = 24
VOCAB, PADDED = 50, 64  # the vocabulary, padded as vLLM pads it (to a multiple of 64)


def _input() -> torch.Tensor:
    return torch.randn(TOKENS, HIDDEN, generator=torch.Generator().manual_seed(5))


def _tokens() -> torch.Tensor:
    return torch.tensor([3, 47, 12, 33, 49])


def _weights(*shapes: tuple[int, int]) -> list[list[torch.Tensor]]:
    generator = torch.Generator().manual_seed(11)
    return [[torch.randn(*s, generator=generator) * 0.3 for s in shapes] for _ in range(LAYERS)]


# -- DTensor -------------------------------------------------------------------------------------


class _MLP(torch.nn.Module):
    def __init__(self, up: torch.Tensor, down: torch.Tensor) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(HIDDEN)
        self.up = torch.nn.Linear(HIDDEN, INTER)
        self.down = torch.nn.Linear(INTER, HIDDEN)
        with torch.no_grad():
            self.up.weight.copy_(up)
            self.down.weight.copy_(down)
            self.up.bias.fill_(0.1)
            self.down.bias.fill_(-0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(functional.gelu(self.up(self.norm(x))))


class MLPStack(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        weights = _weights((INTER, HIDDEN), (HIDDEN, INTER))
        self.layers = torch.nn.ModuleList(_MLP(up, down) for up, down in weights)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def _dtensor_model(rank: int, world: int, variant: str) -> torch.nn.Module:
    model = MLPStack().eval()
    if world == 1:
        return model
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    mesh = init_device_mesh("cpu", (world,))
    plan: dict[str, Any] = {}
    for i in range(LAYERS):
        plan[f"layers.{i}.up"] = ColwiseParallel()
        plan[f"layers.{i}.down"] = RowwiseParallel()
    parallelize_module(model, mesh, plan)
    if variant == "up" and rank == 1:
        with torch.no_grad():
            model.layers[1].up.weight.to_local()[2, 3] += 0.5
    return model


# -- layers with vLLM's attributes ---------------------------------------------------------------


class QKVParallelLinear(torch.nn.Module):
    """vLLM's fused q/k/v projection, as its attributes describe it: rank ``r`` holds its
    ``num_heads`` q heads, then its k and v heads (one copy of a head shared by
    ``num_kv_head_replicas`` ranks when there are fewer k/v heads than ranks)."""

    def __init__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rank: int, world: int):
        super().__init__()
        self.tp_rank, self.tp_size, self.gather_output = rank, world, False
        self.head_size = self.v_head_size = HEAD
        self.total_num_heads, self.total_num_kv_heads = HEADS, KV_HEADS
        self.num_heads = HEADS // world
        self.num_kv_heads = max(KV_HEADS // world, 1)
        self.num_kv_head_replicas = max(world // KV_HEADS, 1)
        kv_sizes = self.num_kv_heads * HEAD * world
        self.output_sizes = [self.num_heads * HEAD * world, kv_sizes, kv_sizes]
        q_rows, kv_rows = self.num_heads * HEAD, self.num_kv_heads * HEAD
        kv_first = rank // self.num_kv_head_replicas * kv_rows
        self.output_partition_sizes = [q_rows, kv_rows, kv_rows]
        weight = torch.cat(
            [
                q[rank * q_rows : (rank + 1) * q_rows],
                k[kv_first : kv_first + kv_rows],
                v[kv_first : kv_first + kv_rows],
            ]
        )
        self.weight = torch.nn.Parameter(weight, requires_grad=False)
        self.bias = None

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, None]:
        return functional.linear(x, self.weight), None


class MergedColumnParallelLinear(torch.nn.Module):
    """vLLM's fused gate/up projection: rank ``r`` holds its rows of gate, then of up."""

    def __init__(self, gate: torch.Tensor, up: torch.Tensor, rank: int, world: int) -> None:
        super().__init__()
        self.tp_rank, self.tp_size, self.gather_output = rank, world, False
        self.output_sizes = [INTER, INTER]
        rows = INTER // world
        self.output_partition_sizes = [rows, rows]
        piece = slice(rank * rows, (rank + 1) * rows)
        weight = torch.cat([gate[piece], up[piece]])
        self.weight = torch.nn.Parameter(weight, requires_grad=False)
        self.bias = None

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, None]:
        return functional.linear(x, self.weight), None


class RowParallelLinear(torch.nn.Module):
    """vLLM's row-parallel projection: its columns of the weight, the partial sums added by an
    all-reduce."""

    def __init__(self, weight: torch.Tensor, rank: int, world: int) -> None:
        super().__init__()
        self.tp_rank, self.tp_size = rank, world
        self.input_is_parallel, self.reduce_results = True, True
        self.input_size = weight.shape[1]
        self.input_size_per_partition = self.input_size // world
        part = self.input_size_per_partition
        shard = weight[:, rank * part : (rank + 1) * part].clone()
        self.weight = torch.nn.Parameter(shard, requires_grad=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, None]:
        out = functional.linear(x, self.weight)
        if self.tp_size > 1:
            dist.all_reduce(out)
        return out, None


class VocabParallelEmbedding(torch.nn.Module):
    """vLLM's vocabulary-parallel embedding: rank ``r`` holds its range of the padded
    vocabulary (the last rank's ends in padding rows, here garbage), looks up the tokens in its
    range (the others' indices masked to 0, their rows zeroed), and the all-reduce adds the
    ranks' rows."""

    def __init__(self, table: torch.Tensor, rank: int, world: int) -> None:
        super().__init__()
        self.tp_rank, self.tp_size = rank, world
        self.org_vocab_size, self.num_added_embeddings = VOCAB, 0
        rows = PADDED // world
        start, end = rank * rows, min((rank + 1) * rows, VOCAB)
        self.shard_indices = SimpleNamespace(
            padded_org_vocab_start_index=start, padded_org_vocab_end_index=start + rows,
            org_vocab_start_index=start, org_vocab_end_index=end,
            added_vocab_start_index=VOCAB, added_vocab_end_index=VOCAB,
        )  # fmt: skip
        weight = torch.full((rows, HIDDEN), 7.0)
        weight[: end - start] = table[start:end]
        self.weight = torch.nn.Parameter(weight, requires_grad=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return functional.embedding(ids, self.weight)
        start = self.shard_indices.org_vocab_start_index
        mine = (ids >= start) & (ids < self.shard_indices.org_vocab_end_index)
        out = functional.embedding((ids - start) * mine, self.weight)
        out.masked_fill_(~mine.unsqueeze(-1), 0)
        dist.all_reduce(out)
        return out


class _Decoder(torch.nn.Module):
    def __init__(self, weights: list[torch.Tensor], rank: int, world: int) -> None:
        super().__init__()
        q, k, v, o, gate, up, down = weights
        self.qkv_proj = QKVParallelLinear(q, k, v, rank, world)
        self.o_proj = RowParallelLinear(o, rank, world)
        self.gate_up_proj = MergedColumnParallelLinear(gate, up, rank, world)
        self.down_proj = RowParallelLinear(down, rank, world)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        qkv, _ = self.qkv_proj(x)
        heads = self.qkv_proj.num_heads
        q, k, v = qkv.split(self.qkv_proj.output_partition_sizes, dim=-1)
        mixed = q * torch.sigmoid(k * v).repeat(1, heads // self.qkv_proj.num_kv_heads)
        attended, _ = self.o_proj(mixed)
        x = x + attended
        gate_up, _ = self.gate_up_proj(x)
        gate, up = gate_up.chunk(2, dim=-1)
        out, _ = self.down_proj(functional.silu(gate) * up)
        return x + out


class FusedStack(torch.nn.Module):
    def __init__(self, rank: int = 0, world: int = 1, variant: str = "clean") -> None:
        super().__init__()
        shapes = [
            (HEADS * HEAD, HIDDEN), (KV_HEADS * HEAD, HIDDEN), (KV_HEADS * HEAD, HIDDEN),
            (HIDDEN, HEADS * HEAD), (INTER, HIDDEN), (INTER, HIDDEN), (HIDDEN, INTER),
        ]  # fmt: skip
        table = torch.randn(VOCAB, HIDDEN, generator=torch.Generator().manual_seed(3))
        self.embed_tokens = VocabParallelEmbedding(table, rank, world)
        layers = []
        for i, weights in enumerate(_weights(*shapes)):
            if i == 1 and variant == "q":  # rank 1's first q head (rank 1 of TP=2)
                weights[0][HEADS // 2 * HEAD, 3] += 0.5
            layers.append(_Decoder(weights, rank, world))
        self.layers = torch.nn.ModuleList(layers)
        if variant == "k" and rank == 1:  # rank 1's copy of the shared k head
            with torch.no_grad():
                qkv = self.layers[1].qkv_proj
                qkv.weight[qkv.num_heads * HEAD + 1, 3] += 0.5

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(ids)
        for layer in self.layers:
            x = layer(x)
        return x


# -- runs ------------------------------------------------------------------------------------------


def _model(kind: str, rank: int, world: int, variant: str) -> torch.nn.Module:
    if kind == "dtensor":
        return _dtensor_model(rank, world, variant)
    # the q variant plants in the full weights: only the rank holding that head differs
    planted = variant if world > 1 or variant == "clean" else "clean"
    return FusedStack(rank, world, planted).eval()


def _capture(root: Path, kind: str, world: int, variant: str, rank: int = 0) -> Path:
    from pytest_precision import capture

    path = root / f"{kind}-tp{world}-{variant}"
    model = _model(kind, rank, world, variant)
    with torch.no_grad(), capture(model, path, level="mix"):
        model(_input() if kind == "dtensor" else _tokens())
    return path


def _rank(rank: int, world: int, root: str, runs: list[tuple[str, str]]) -> None:
    faulthandler.dump_traceback_later(120, exit=True)
    dist.init_process_group(
        "gloo", init_method=f"file://{root}/tp{world}.store", rank=rank, world_size=world
    )
    try:
        for kind, variant in runs:
            _capture(Path(root), kind, world, variant, rank)
    finally:
        dist.destroy_process_group()
        faulthandler.cancel_dump_traceback_later()


def capture_runs(root: Path, world: int, runs: list[tuple[str, str]]) -> dict[str, Path]:
    """The dumps of each ``(kind, variant)`` at TP=``world`` (in this process for 1, else in
    one gloo group of processes), by ``kind-tp<world>-variant``."""
    if world == 1:
        paths = [_capture(root, kind, 1, variant) for kind, variant in runs]
    else:
        mp.spawn(_rank, args=(world, str(root), runs), nprocs=world, join=True)
        paths = [root / f"{kind}-tp{world}-{variant}" for kind, variant in runs]
    return {p.name: p for p in paths}
