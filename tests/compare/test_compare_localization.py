"""compare_dumps' first-divergence localization on real captures of the tiny Llama: a bug
injected as a weight, a constant, other ops or a kernel is found and blamed on its call."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from compare_helpers import CONFIG, IDS, MODES, dump_llama, judged_in_shards
from replay_helpers import BrokenOp

import examples.tiny_llama as tiny
from examples.tiny_llama import build_tiny_llama
from pytest_precision import TensorComparison, capture, compare_dumps, load_dump
from pytest_precision.report import render


def _chunked_rotate_half(x: torch.Tensor) -> torch.Tensor:
    """A RoPE bug written with other ops: the halves are swapped the wrong way round."""
    first, second = x.chunk(2, dim=-1)
    return torch.cat((second, -first), dim=-1)


# -- localization ----------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("level", ["mix", "op", "module"])
def test_identical_runs_do_not_diverge(dumps: Callable[..., Path], mode: str, level: str) -> None:
    golden = dumps(mode, level)
    again = dump_llama(golden.parent / "again", build_tiny_llama(CONFIG), mode, level)
    result = compare_dumps(golden, again)
    assert result.passed
    assert result.first_divergence is None
    assert result.unmatched == []
    assert result.counts()["fail"] == 0
    assert len(result.records) == len(load_dump(golden))
    assert "no divergence: every compared record is within the standard" in render(result)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("level", ["mix", "module"])
def test_bf16_against_fp32_is_noise(dumps: Callable[..., Path], mode: str, level: str) -> None:
    result, culprits = judged_in_shards(dumps(mode, level), dumps(mode, level, "bf16"))
    assert result.first_divergence is None, render(result)
    assert culprits == [], culprits[0].reason  # no shard of --precision-compare fails
    assert result.counts()["fail"] > 0  # differences beyond the standard: carried, not made
    # drifting calls that could not be rerun make the answer "inconclusive", never silently
    verdict = "inconclusive" if result.unverified else "no call is guilty"
    assert verdict in render(result)
    if mode == "tensor" and level == "mix":
        # every drifting op was rerun in float64 and cleared; none had to be taken on trust
        assert result.unverified == []


@pytest.mark.parametrize("mode", MODES)
def test_a_corrupted_weight_is_the_source(dumps: Callable[..., Path], mode: str) -> None:
    result = compare_dumps(dumps(mode), dumps(mode, "mix", "weight"))
    d = result.first_divergence
    assert d is not None
    assert (d.cause, d.name, d.record.slot) == (
        "source",
        "Functional.linear.13.forward",
        "input.1",
    )
    assert (d.module, d.layer) == ("model.layers.1.mlp.down_proj", "model.layers.1")
    assert "parameter model.layers.1.mlp.down_proj.weight" in d.reason
    if mode == "tensor":
        assert isinstance(d.metrics, TensorComparison)
        assert d.metrics.max_abs_index == (3, 5)


@pytest.mark.parametrize("mode", MODES)
def test_module_level_names_the_corrupted_parameter(dumps: Callable[..., Path], mode: str) -> None:
    d = compare_dumps(dumps(mode, "module"), dumps(mode, "module", "weight")).first_divergence
    assert d is not None
    assert (d.cause, d.name, d.record.slot) == (
        "source",
        "Module.model.layers.1.mlp.down_proj.Linear.forward.0",
        "parameters.weight",
    )
    assert d.reason.startswith("parameter model.layers.1.mlp.down_proj.weight differs")


@pytest.mark.parametrize("mode", MODES)
def test_a_wrong_softmax_scale_is_a_differing_constant(
    dumps: Callable[..., Path], mode: str
) -> None:
    d = compare_dumps(dumps(mode), dumps(mode, "mix", "scale")).first_divergence
    assert d is not None
    assert (d.cause, d.module, d.record.slot) == ("source", "model.layers.1.self_attn", "input.1")
    assert d.name.startswith("Tensor.mul.")
    assert "argument input.1" in d.reason
    assert "0.3 vs 0.25" in d.reason


@pytest.mark.parametrize("mode", MODES)
def test_a_rope_bug_written_with_other_ops_is_unmatched_code(
    dumps: Callable[..., Path], mode: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    golden = dumps(mode)  # before the bug is patched in
    monkeypatch.setattr(tiny, "rotate_half", _chunked_rotate_half)
    result = compare_dumps(golden, dump_llama(tmp_path / "rope", build_tiny_llama(CONFIG), mode))
    d = result.first_divergence
    assert d is not None
    assert (d.cause, d.module, d.layer) == (
        "unmatched",
        "model.layers.0.self_attn",
        "model.layers.0",
    )
    assert "Tensor.chunk.0.forward" in d.reason
    assert {u.side for u in result.unmatched} == {"golden", "target"}


@pytest.mark.parametrize("mode", MODES)
def test_a_rope_bug_at_module_level_convicts_the_attention(
    dumps: Callable[..., Path], mode: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    golden = dumps(mode, "module")  # before the bug is patched in
    monkeypatch.setattr(tiny, "rotate_half", _chunked_rotate_half)
    target = dump_llama(tmp_path / "rope", build_tiny_llama(CONFIG), mode, "module")
    d = compare_dumps(golden, target).first_divergence
    assert d is not None
    assert (d.cause, d.name) == ("output", "Module.model.layers.0.self_attn.Attention.forward.0")
    assert "inputs match the golden exactly" in d.reason


@pytest.mark.parametrize(("mode", "cause"), [("tensor", "rerun"), ("statistics", "output")])
def test_a_broken_kernel_is_convicted_where_it_runs(
    dumps: Callable[..., Path], mode: str, cause: str, tmp_path: Path
) -> None:
    golden = dumps(mode)  # before the kernel breaks
    model = build_tiny_llama(CONFIG)
    with BrokenOp(F.softmax, 2), torch.no_grad(), capture(model, tmp_path / "t", mode=mode):
        model(IDS)
    d = compare_dumps(golden, tmp_path / "t").first_divergence
    assert d is not None
    assert (d.cause, d.name) == (cause, "Functional.softmax.1.forward")
    assert (d.module, d.layer) == ("model.layers.1.self_attn", "model.layers.1")
    if cause == "rerun":
        assert "rerun of the call from its own recorded inputs" in d.reason


@pytest.mark.parametrize("mode", MODES)
def test_an_extra_op_shifts_no_names_into_false_differences(
    dumps: Callable[..., Path], mode: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    forward = tiny.MLP.forward

    def with_extra_op(self: tiny.MLP, x: torch.Tensor) -> torch.Tensor:
        return forward(self, x * 1.0)

    golden = dumps(mode)  # before the extra op is patched in
    monkeypatch.setattr(tiny.MLP, "forward", with_extra_op)
    result = compare_dumps(golden, dump_llama(tmp_path / "extra", build_tiny_llama(CONFIG), mode))
    assert result.passed
    assert result.counts()["fail"] == 0
    # one Tensor.mul per layer, and every later Tensor.mul is renumbered, yet aligned
    assert [(u.side, u.module) for u in result.unmatched] == [
        ("target", "model.layers.0.mlp"),
        ("target", "model.layers.1.mlp"),
    ]
    assert any(r.name != r.golden_name for r in result.records)


def test_statistics_golden_against_tensor_target_compares_statistics(
    dumps: Callable[..., Path],
) -> None:
    result = compare_dumps(dumps("statistics"), dumps("tensor", "mix", "weight"))
    d = result.first_divergence
    assert d is not None
    assert (d.cause, d.name) == ("source", "Functional.linear.13.forward")
    assert "statistics differ" in d.reason
