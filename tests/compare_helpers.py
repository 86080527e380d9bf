"""Helpers shared by the compare_dumps tests: the float32 tiny Llama, its injected bugs, a
capture of it per mode and level, and a comparison judged in shards."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import torch

from examples.tiny_llama import TinyLlamaConfig, build_tiny_llama, example_input_ids
from pytest_precision import Divergence, Dump, DumpComparison, ShardedComparison, capture

CONFIG = TinyLlamaConfig()
IDS = example_input_ids(CONFIG, seq=8)
MODES = ["tensor", "statistics"]


def dump_llama(path: Path, model: torch.nn.Module, mode: str, level: str = "mix") -> Path:
    """Capture ``model``'s forward on ``IDS`` into ``path``."""
    with torch.no_grad(), capture(model, path, mode=mode, level=level):
        model(IDS)
    return path


def _corrupt_weight() -> torch.nn.Module:
    model = build_tiny_llama(CONFIG)
    with torch.no_grad():
        model.model.layers[1].mlp.down_proj.weight[3, 5] += 1.0
    return model


def _scale_bug_in_layer_1() -> torch.nn.Module:
    model = build_tiny_llama(CONFIG)
    model.model.layers[1].self_attn.config = CONFIG.with_(attention_scale=0.3)
    return model


VARIANTS: dict[str, Callable[[], torch.nn.Module]] = {
    "golden": lambda: build_tiny_llama(CONFIG),
    "bf16": lambda: build_tiny_llama(CONFIG, dtype=torch.bfloat16),
    "weight": _corrupt_weight,
    "scale": _scale_bug_in_layer_1,
}


def judged_in_shards(
    golden: Dump | str | os.PathLike[str], target: Dump | str | os.PathLike[str]
) -> tuple[DumpComparison, list[Divergence]]:
    """The comparison as ``--precision-compare`` makes it: every shard measured, then all
    judged together (``compare_dumps``' report, measured once); with the calls whose own
    records convict them, which fail their shard's test."""
    sharded = ShardedComparison(golden, target)
    culprits = [d for shard in sharded.shards for d in sharded.measure(shard).culprits]
    return sharded.result(), culprits
