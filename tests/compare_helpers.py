"""Helpers shared by the compare_dumps tests: the float32 tiny Llama, its injected bugs, and
a capture of it per mode and level."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from examples.tiny_llama import TinyLlamaConfig, build_tiny_llama, example_input_ids
from pytest_precision import capture

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
