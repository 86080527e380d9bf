"""Completion order follows the recorded nesting: a module shared between layers (vLLM builds
one rotary embedding and registers it under layer 0) runs inside the layer that called it."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from pytest_precision import capture, compare_dumps, load_dump
from pytest_precision.compare._alignment import completion_order
from pytest_precision.report import render


class Layer(nn.Module):
    def __init__(self, shared: nn.Module) -> None:
        super().__init__()
        self.shared = shared
        self.norm = nn.LayerNorm(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.shared(x) + x)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        shared = nn.Linear(8, 8)  # registered under layers.0 first, so named layers.0.shared
        self.layers = nn.ModuleList([Layer(shared), Layer(shared)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def _capture(net: Net, path: Path) -> Path:
    torch.manual_seed(0)
    with torch.no_grad(), capture(net, path, level="mix", mode="tensor"):
        net(torch.randn(2, 8))
    return path


def test_a_shared_module_runs_inside_the_layer_that_called_it(tmp_path: Path) -> None:
    torch.manual_seed(0)
    dump = load_dump(_capture(Net(), tmp_path / "d"))
    order = [c.name for c in completion_order(list(dump.calls))]
    layer_1 = order.index("Module.layers.1.Layer.forward.0")
    shared_in_layer_1 = order.index("Module.layers.0.shared.Linear.forward.1")
    norm_1 = order.index("Module.layers.1.norm.LayerNorm.forward.0")
    assert shared_in_layer_1 < norm_1 < layer_1


def test_a_weight_changed_after_the_shared_call_is_found_in_its_module(tmp_path: Path) -> None:
    torch.manual_seed(0)
    net = Net()
    golden = _capture(net, tmp_path / "golden")
    with torch.no_grad():
        net.layers[1].norm.weight[:2] *= 1.5
    result = compare_dumps(golden, _capture(net, tmp_path / "target"))
    culprit = result.first_divergence
    assert culprit is not None, render(result)
    assert culprit.module is not None
    assert culprit.module.startswith("layers.1.norm"), render(result)
    assert culprit.rule == "source", render(result)
