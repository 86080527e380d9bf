"""A real tensor-parallel capture: two processes in a gloo group on CPU, each running a
row-parallel projection whose partial sums ``torch.distributed.all_reduce`` adds in place,
then a residual add, under :func:`capture`. Variants: ``golden`` (float32), ``bf16``, ``weight``
(rank 1's first weight shard off), ``async`` (float32, the all_reduce asynchronous, waited for
after the next op)."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

HIDDEN, TOKENS, LAYERS, RANKS = 16, 4, 2, 2


class _Layer(torch.nn.Module):
    def __init__(self, weight: torch.Tensor, asynchronous: bool) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(HIDDEN, HIDDEN, bias=False)
        self.asynchronous = asynchronous
        with torch.no_grad():
            self.proj.weight.copy_(weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        partial = self.proj(x)
        work = dist.all_reduce(partial, async_op=self.asynchronous)  # in place: the sum
        doubled = x * 2  # overlaps the reduction when it is asynchronous
        if work is not None:
            work.wait()
        return doubled + partial


class _Model(torch.nn.Module):
    def __init__(self, rank: int, variant: str) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(100 + rank)
        weights = [torch.randn(HIDDEN, HIDDEN, generator=generator) * 0.2 for _ in range(LAYERS)]
        if variant == "weight" and rank == 1:
            weights[0][3, 5] += 1.0
        self.layers = torch.nn.ModuleList(_Layer(w, variant == "async") for w in weights)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def _rank(rank: int, root: str, variant: str) -> None:
    from pytest_precision import capture

    dist.init_process_group(
        "gloo", init_method=f"file://{root}/{variant}.store", rank=rank, world_size=RANKS
    )
    try:
        model = _Model(rank, variant).eval()
        x = torch.randn(TOKENS, HIDDEN, generator=torch.Generator().manual_seed(7))
        if variant == "bf16":
            model, x = model.to(torch.bfloat16), x.to(torch.bfloat16)
        with torch.no_grad(), capture(model, Path(root) / variant, mode="tensor", level="mix"):
            model(x)
    finally:
        dist.destroy_process_group()


def capture_tp(root: Path, variant: str) -> Path:
    """The dump of ``variant``, both ranks, under ``root/variant``."""
    mp.spawn(_rank, args=(str(root), variant), nprocs=RANKS, join=True)
    return root / variant
