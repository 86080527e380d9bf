"""A backend that packs a layer's weights elsewhere (vLLM CPU hands bf16 linears to oneDNN and
leaves an empty parameter) is no weight difference: the empty parameter is skipped, and a wrong
packed weight is still found where it is used."""

from __future__ import annotations

from pathlib import Path

import torch

from pytest_precision import capture, compare_dumps


class _Linear(torch.nn.Module):
    def __init__(self, weight: torch.Tensor, *, packed: bool) -> None:
        super().__init__()
        if packed:  # the parameter left behind, the weights in a private buffer
            self.weight = torch.nn.Parameter(torch.empty(0), requires_grad=False)
            self._packed: torch.Tensor | None = weight.clone()
        else:
            self.weight = torch.nn.Parameter(weight.clone(), requires_grad=False)
            self._packed = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.weight if self._packed is None else self._packed
        return torch.nn.functional.linear(x, weight)


def _dump(path: Path, weight: torch.Tensor, *, packed: bool) -> Path:
    model = torch.nn.Sequential(_Linear(weight, packed=packed), torch.nn.ReLU())
    with torch.no_grad(), capture(model, path, level="mix"):
        model(torch.linspace(-1, 1, 24).reshape(3, 8))
    return path


def test_an_empty_parameter_is_skipped_not_convicted(tmp_path: Path) -> None:
    weight = torch.randn(4, 8, generator=torch.Generator().manual_seed(0))
    golden = _dump(tmp_path / "golden", weight, packed=False)
    target = _dump(tmp_path / "target", weight, packed=True)
    result = compare_dumps(golden, target)
    assert result.first_divergence is None, result
    skipped = [r for r in result.records if r.slot == "parameters.weight"]
    assert skipped
    assert all(r.status == "skip" for r in skipped)


def test_a_wrong_packed_weight_is_still_found(tmp_path: Path) -> None:
    weight = torch.randn(4, 8, generator=torch.Generator().manual_seed(0))
    golden = _dump(tmp_path / "golden", weight, packed=False)
    target = _dump(tmp_path / "target", weight * 1.5, packed=True)
    assert compare_dumps(golden, target).first_divergence is not None
