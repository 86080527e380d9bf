"""A Megatron-style tensor-parallel MLP stack run at several TP sizes on CPU (gloo), for the
cross-layout comparison tests.

Each layer: a replicated LayerNorm, a column-parallel up projection (rank r holds rows
``r * I/n .. (r+1) * I/n`` of the full weight), GELU, a row-parallel down projection (the
matching columns) whose partial sums ``all_reduce`` adds, and the residual. The weights are the
same full matrices at every TP size, so TP=1, 2 and 4 compute the same function. The ``shard``
variant puts one element of the last rank's up-projection shard in layer 1 off by 0.5.
"""

from __future__ import annotations

import faulthandler
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

HIDDEN, INTER, TOKENS, LAYERS = 16, 32, 6, 2


def _full_weights() -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(11)
    return [
        (
            torch.randn(INTER, HIDDEN, generator=generator) * 0.3,
            torch.randn(HIDDEN, INTER, generator=generator) * 0.3,
        )
        for _ in range(LAYERS)
    ]


class _Layer(torch.nn.Module):
    def __init__(self, up: torch.Tensor, down: torch.Tensor, world: int) -> None:
        super().__init__()
        self.world = world
        self.norm = torch.nn.LayerNorm(HIDDEN)
        self.up = torch.nn.Linear(HIDDEN, up.shape[0], bias=False)
        self.down = torch.nn.Linear(down.shape[1], HIDDEN, bias=False)
        with torch.no_grad():
            self.up.weight.copy_(up)
            self.down.weight.copy_(down)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        partial = self.down(torch.nn.functional.gelu(self.up(self.norm(x))))
        if self.world > 1:
            dist.all_reduce(partial)
        return x + partial


class TPModel(torch.nn.Module):
    def __init__(self, rank: int = 0, world: int = 1, variant: str = "clean") -> None:
        super().__init__()
        layers = []
        for i, (up, down) in enumerate(_full_weights()):
            rows = INTER // world
            up_shard = up[rank * rows : (rank + 1) * rows].clone()
            if variant == "shard" and i == 1 and rank == world - 1:
                up_shard[2, 3] += 0.5
            layers.append(_Layer(up_shard, down[:, rank * rows : (rank + 1) * rows], world))
        self.layers = torch.nn.ModuleList(layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def _input() -> torch.Tensor:
    return torch.randn(TOKENS, HIDDEN, generator=torch.Generator().manual_seed(5))


def _rank(rank: int, world: int, root: str, variant: str, mode: str) -> None:
    from pytest_precision import capture

    faulthandler.dump_traceback_later(120, exit=True)
    name = f"tp{world}-{variant}-{mode}"
    dist.init_process_group(
        "gloo", init_method=f"file://{root}/{name}.store", rank=rank, world_size=world
    )
    try:
        model = TPModel(rank, world, variant).eval()
        with torch.no_grad(), capture(model, Path(root) / name, level="mix", mode=mode):
            model(_input())
    finally:
        dist.destroy_process_group()
        faulthandler.cancel_dump_traceback_later()


def capture_tp(root: Path, world: int, variant: str = "clean", mode: str = "tensor") -> Path:
    """The dump of the model at TP=``world`` (in-process for 1, else gloo processes)."""
    name = f"tp{world}-{variant}-{mode}"
    if world == 1:
        from pytest_precision import capture

        model = TPModel(variant=variant).eval()
        with torch.no_grad(), capture(model, root / name, level="mix", mode=mode):
            model(_input())
    else:
        mp.spawn(_rank, args=(world, str(root), variant, mode), nprocs=world, join=True)
    return root / name
