"""Positions the attention mask excludes are not evidence: two runs whose pad positions hold
other values but whose real positions agree pass, and say what they left out; a model whose
attention lets the pad positions into real ones is still convicted where it does so."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import hf_zoo
import pytest
import torch
from compare_helpers import judged_in_shards
from hf_bugs import ignored_padding_mask

from pytest_precision import capture, compare_dumps, load_dump
from pytest_precision.report import render

MODES = ("tensor", "statistics")
LEFT_OUT = "padding: 3 of 16 positions left out (attention mask)"


def _capture(model: torch.nn.Module, path: Path, mode: str, pad_token: int = 0) -> Path:
    """hf_zoo's batch, its left-padded row's pad positions holding ``pad_token``."""
    batch = hf_zoo.inputs()
    batch["input_ids"][1, : hf_zoo.PAD] = pad_token
    with torch.no_grad(), capture(model, path, level="mix", mode=mode):
        model(**batch, use_cache=False)
    return path


@pytest.mark.parametrize("mode", MODES)
def test_other_values_at_pad_positions_are_not_evidence(mode: str, tmp_path: Path) -> None:
    """Another pad token: every tensor differs at the pad positions, no real one moves."""
    model = hf_zoo.build("llama")
    golden = _capture(model, tmp_path / "golden", mode)
    target = _capture(model, tmp_path / "target", mode, pad_token=7)
    result, culprits = judged_in_shards(golden, target)
    assert result.first_divergence is None, render(result)
    assert culprits == []
    assert result.passed
    assert (result.padding.positions, result.padding.of) == (3, 16)  # type: ignore[union-attr]
    assert LEFT_OUT in render(result)


def test_dumps_without_the_mask_are_compared_whole(tmp_path: Path) -> None:
    """A dump that does not say where it pads (an older one) is judged as before."""
    model = hf_zoo.build("llama")
    golden = load_dump(_capture(model, tmp_path / "golden", "tensor"))
    target = load_dump(_capture(model, tmp_path / "target", "tensor", pad_token=7))
    unmarked = replace(target, records=[replace(r, padding=None) for r in target.records])
    result = compare_dumps(golden, unmarked)
    assert result.padding is None
    assert result.first_divergence is not None
    assert LEFT_OUT not in render(result)


@pytest.mark.parametrize("mode", MODES)
def test_pad_positions_leaking_into_real_ones_are_convicted(mode: str, tmp_path: Path) -> None:
    """Layer 1's attention ignores the padding: row 1's real positions attend to its pads."""
    golden = _capture(hf_zoo.build("llama"), tmp_path / "golden", mode)
    model = hf_zoo.build("llama")
    where = ignored_padding_mask(model, hf_zoo.ARCHS["llama"])
    result, _ = judged_in_shards(golden, _capture(model, tmp_path / "target", mode))
    assert result.padding is not None
    d = result.first_divergence
    assert d is not None, render(result)
    assert d.module is not None
    assert d.module.startswith(where), (d.name, d.module, d.reason)
