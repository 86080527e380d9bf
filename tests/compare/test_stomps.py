"""A stomp (memory written outside any recorded call) is named as such, not blamed on the
innocent call that read it: tiny HF Llama, the stomp planted inside the model's forward."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from compare_helpers import judged_in_shards
from dump_helpers import stomp
from hf_zoo import build, forward, submodule

from pytest_precision import capture, compare_dumps, replay_op

#: hooks that stomp inside layer 1, each a (module path, hook kind, hook)
_Plant = Callable[[torch.nn.Module], list[torch.utils.hooks.RemovableHandle]]


def _norm_output(model: torch.nn.Module) -> list[torch.utils.hooks.RemovableHandle]:
    """Layer 1's input norm put out its result; before the attention reads it, 3 elements of
    it are overwritten."""

    def hook(module: torch.nn.Module, args: Any, kwargs: dict[str, Any]) -> None:
        stomp(kwargs["hidden_states"])

    attention = submodule(model, "model.layers.1.self_attn")
    return [attention.register_forward_pre_hook(hook, with_kwargs=True)]


def _residual(model: torch.nn.Module) -> list[torch.utils.hooks.RemovableHandle]:
    """Out of band: layer 1's input, kept for the residual add, is overwritten while the
    attention runs (after q_proj), long after layer 0 put it out."""
    kept: list[torch.Tensor] = []

    def keep(module: torch.nn.Module, args: Any, kwargs: dict[str, Any]) -> None:
        kept[:] = [kwargs.get("hidden_states", args[0] if args else None)]

    def hook(module: torch.nn.Module, args: Any, output: Any) -> None:
        stomp(kept[0])

    layer = submodule(model, "model.layers.1")
    q_proj = submodule(model, "model.layers.1.self_attn.q_proj")
    return [
        layer.register_forward_pre_hook(keep, with_kwargs=True),
        q_proj.register_forward_hook(hook),
    ]


def _inside_the_norm(model: torch.nn.Module) -> list[torch.utils.hooks.RemovableHandle]:
    """Layer 1's input norm's last op returned; before the norm returns, its result is
    overwritten: capture sees it first at the norm's own output record."""

    def hook(module: torch.nn.Module, args: Any, output: torch.Tensor) -> None:
        stomp(output)

    return [submodule(model, "model.layers.1.input_layernorm").register_forward_hook(hook)]


def _dump(path: Path, mode: str, plant: _Plant | None = None) -> Path:
    model = build("llama")
    handles = [] if plant is None else plant(model)  # registered before capture's: run first
    with torch.no_grad(), capture(model, path, mode=mode):  # type: ignore[arg-type]
        forward(model)
    for handle in handles:
        handle.remove()
    return path


@pytest.mark.parametrize("mode", ["tensor", "statistics"])
def test_a_stomped_norm_output_is_named_not_the_linear(tmp_path: Path, mode: str) -> None:
    golden = _dump(tmp_path / "golden", mode)
    result = compare_dumps(golden, _dump(tmp_path / "stomped", mode, _norm_output))
    d = result.first_divergence
    assert d is not None
    assert (d.cause, d.rule) == ("stomp", "stomp"), d.reason
    assert d.name.startswith("Functional.linear.")  # the first reader, not convicted
    assert (d.module, d.layer) == ("model.layers.1", "model.layers.1")
    assert re.match(
        r"changed between `Tensor\.mul\.\d+\.forward` output\.0 and `Functional\.linear\.\d+"
        r"\.forward` input\.0: memory written outside any recorded call",
        d.reason,
    )
    assert "capture found" in d.reason
    assert result.verdict == "divergence"


@pytest.mark.parametrize("mode", ["tensor", "statistics"])
def test_an_out_of_band_stomp_of_the_residual_is_named(tmp_path: Path, mode: str) -> None:
    golden = _dump(tmp_path / "golden", mode)
    d = compare_dumps(golden, _dump(tmp_path / "stomped", mode, _residual)).first_divergence
    assert d is not None
    assert d.cause == "stomp", d.reason
    assert d.name.startswith("Tensor.add.")  # the residual add reads it
    assert d.layer == "model.layers.1"
    assert re.match(r"changed between `Tensor\.add\.\d+\.forward` output\.0 ", d.reason)


@pytest.mark.parametrize("mode", ["tensor", "statistics"])
def test_a_stomp_is_found_without_capture_evidence(tmp_path: Path, mode: str) -> None:
    """A dump that does not carry ``changed_since`` (msprobe, an older capture): the consumer
    read what its producer's counterpart never put out."""
    golden = _dump(tmp_path / "golden", mode)
    stomped = _dump(tmp_path / "stomped", mode, _norm_output)
    index = stomped / "rank0" / "records.jsonl"
    text = index.read_text()
    index.write_text(re.sub(r',"changed_since":\{[^}]*\}', "", text))
    assert index.read_text() != text
    d = compare_dumps(golden, stomped).first_divergence
    assert d is not None
    assert d.cause == "stomp", d.reason
    assert d.name.startswith("Functional.linear.")
    assert d.layer == "model.layers.1"
    assert "in the golden it reads that output unchanged" in d.reason


def test_clean_against_clean_passes(tmp_path: Path) -> None:
    golden = _dump(tmp_path / "golden", "tensor")
    assert compare_dumps(golden, _dump(tmp_path / "again", "tensor")).passed


def test_a_shard_proves_the_stomp_and_convicts_no_reader(tmp_path: Path) -> None:
    golden = _dump(tmp_path / "golden", "tensor")
    result, culprits = judged_in_shards(golden, _dump(tmp_path / "stomped", "tensor", _norm_output))
    assert result.first_divergence is not None
    assert result.first_divergence.cause == "stomp"
    assert culprits
    assert {d.cause for d in culprits} == {"stomp"}, [(d.name, d.reason) for d in culprits]


def test_the_reader_of_a_stomp_replays_as_context(tmp_path: Path) -> None:
    golden = _dump(tmp_path / "golden", "tensor")
    stomped = _dump(tmp_path / "stomped", "tensor", _norm_output)
    d = compare_dumps(golden, stomped).first_divergence
    assert d is not None
    replayed = replay_op(stomped, d.name)
    assert replayed.verdict == "context"
    assert "(a stomp)" in replayed.reason
    assert replay_op(golden, d.name).verdict == "noise"


def test_a_stomp_seen_first_at_a_module_output_is_named(tmp_path: Path) -> None:
    golden = _dump(tmp_path / "golden", "statistics")
    d = compare_dumps(golden, _dump(tmp_path / "stomped", "statistics", _inside_the_norm))
    divergence = d.first_divergence
    assert divergence is not None
    assert divergence.cause == "stomp", divergence.reason
    assert divergence.name == "Module.model.layers.1.input_layernorm.LlamaRMSNorm.forward.0"
    assert divergence.module == "model.layers.1.input_layernorm"
    assert divergence.reason.startswith("changed between `Tensor.mul.")


class _TwoScales(torch.nn.Module):
    """Two parameters of ones (as every norm weight starts), each read through ``detach``."""

    def __init__(self) -> None:
        super().__init__()
        self.first = torch.nn.Parameter(torch.ones(8), requires_grad=False)
        self.second = torch.nn.Parameter(torch.ones(8), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.first.detach() + x * self.second.detach()


def test_a_changed_weight_equal_in_content_to_another_is_no_stomp(tmp_path: Path) -> None:
    """In the golden the second weight reads exactly what reading the first put out (both are
    ones): content alone must not make that a producer, and the changed weight a stomp."""
    x = torch.arange(8.0)
    golden, target = _TwoScales(), _TwoScales()
    with torch.no_grad():
        target.second[:2] *= 1.5
    for model, name in ((golden, "golden"), (target, "target")):
        with torch.no_grad(), capture(model, tmp_path / name, level="op"):
            model(x)
    d = compare_dumps(tmp_path / "golden", tmp_path / "target").first_divergence
    assert d is not None
    assert (d.name, d.cause) == ("Tensor.detach.1.forward", "source")
