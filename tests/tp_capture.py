"""A real tensor-parallel capture: two processes in a gloo group on CPU, each running a
row-parallel projection whose partial sums ``torch.distributed.all_reduce`` adds in place,
then a residual add, under :func:`capture`. Variants:

- ``golden`` (float32), ``bf16``, ``weight`` (rank 1's first weight shard off);
- ``async``: the all_reduce asynchronous, waited for after the next op;
- ``excluded``: ``exclude=["Distributed.*"]``, the all_reduce not recorded;
- ``detach``: the partial sum read through ``.detach()`` (no ``_base``) before and after;
- ``p2p``: the ranks then swap the reduced tensor with ``irecv`` / ``isend`` (async);
- ``funcol``: the functional all_reduce (``torch.ops._c10d_functional``), then ``wait_tensor``;
- ``driver``: a second decode step whose input rank 0 broadcasts outside the forward.

A rank that hangs is killed after two minutes, so a hang fails the test instead of the run."""

from __future__ import annotations

import faulthandler
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

HIDDEN, TOKENS, LAYERS, RANKS = 16, 4, 2, 2


class _Layer(torch.nn.Module):
    def __init__(self, weight: torch.Tensor, variant: str) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(HIDDEN, HIDDEN, bias=False)
        self.variant = variant
        with torch.no_grad():
            self.proj.weight.copy_(weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        partial = self.proj(x)
        alias = partial
        if self.variant == "detach":
            alias = partial.detach()  # shares storage and version counter, has no ``_base``
            alias.mul(1.0)  # records the partial sum through the alias, before the reduction
        if self.variant == "funcol":  # out of place; the result arrives at wait_tensor
            functional = torch.ops._c10d_functional
            reduced = functional.all_reduce(partial, "sum", dist.group.WORLD.group_name)
            doubled = x * 2
            return doubled + functional.wait_tensor(reduced)
        work = dist.all_reduce(partial, async_op=self.variant == "async")  # in place: the sum
        doubled = x * 2  # overlaps the reduction when it is asynchronous
        if work is not None:
            work.wait()
        if self.variant == "p2p":
            other, peer = torch.zeros_like(partial), 1 - dist.get_rank()
            received = dist.irecv(other, src=peer)
            dist.isend(partial.clone(), dst=peer).wait()
            received.wait()
            return doubled + other
        return doubled + alias


class _Model(torch.nn.Module):
    def __init__(self, rank: int, variant: str) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(100 + rank)
        weights = [torch.randn(HIDDEN, HIDDEN, generator=generator) * 0.2 for _ in range(LAYERS)]
        if variant == "weight" and rank == 1:
            weights[0][3, 5] += 1.0
        self.layers = torch.nn.ModuleList(_Layer(w, variant) for w in weights)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def _rank(rank: int, root: str, variant: str) -> None:
    from pytest_precision import capture

    faulthandler.dump_traceback_later(120, exit=True)
    dist.init_process_group(
        "gloo", init_method=f"file://{root}/{variant}.store", rank=rank, world_size=RANKS
    )
    try:
        model = _Model(rank, variant).eval()
        x = torch.randn(TOKENS, HIDDEN, generator=torch.Generator().manual_seed(7 + rank))
        if variant == "bf16":
            model, x = model.to(torch.bfloat16), x.to(torch.bfloat16)
        exclude = ["Distributed.*"] if variant == "excluded" else None
        path = Path(root) / variant
        with torch.no_grad(), capture(model, path, level="mix", exclude=exclude) as cap:
            model(x)
            if variant == "driver":
                dist.broadcast(x, src=0)  # outside the forward, in place: rank 0's input
                cap.step()
                model(x)
    finally:
        dist.destroy_process_group()
        faulthandler.cancel_dump_traceback_later()


def capture_tp(root: Path, variant: str) -> Path:
    """The dump of ``variant``, both ranks, under ``root/variant``."""
    mp.spawn(_rank, args=(str(root), variant), nprocs=RANKS, join=True)
    return root / variant
