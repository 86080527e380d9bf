"""compare_dumps on hard cases: equivalent rewrites are noise, lost residuals, dtype slips and
off weights are blamed, incomplete comparisons never pass."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from compare_helpers import CONFIG, IDS, MODES, dump_llama, judged_in_shards

import examples.tiny_llama as tiny
from examples.tiny_llama import build_tiny_llama, example_input_ids, greedy_generate
from pytest_precision import capture, compare_dumps, load_dump
from pytest_precision.report import render

# -- what the adversarial review found -------------------------------------------------------------


def _sdpa_attention(
    self: tiny.Attention, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: object
) -> torch.Tensor:
    """The same attention through the fused kernel: other ops, the same values up to rounding."""
    q, k, v = self.heads(x, cos, sin)
    return self.merge_heads(F.scaled_dot_product_attention(q, k, v, is_causal=True))


def _without_attention_residual(self: tiny.DecoderLayer, x: Any, cos: Any, sin: Any, m: Any) -> Any:
    x = self.self_attn(self.input_layernorm(x), cos, sin, m)
    return x + self.mlp(self.post_attention_layernorm(x))


def _fused_rms_norm(self: tiny.RMSNorm, x: torch.Tensor) -> torch.Tensor:
    """The norm through ``F.rms_norm``, its casts in another order than the golden's."""
    return F.rms_norm(x.float(), (x.shape[-1],), self.weight.float(), self.eps).to(x.dtype)


def _transposed_the_other_way(self: tiny.Attention, x: torch.Tensor, *args: Any) -> Any:
    """``transpose(2, 3)`` for ``transpose(-1, -2)``: another spelling of the same call."""
    q, k, v = self.heads(x, *args[:2])
    scores = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(self.config.head_dim)
    probs = F.softmax(scores.masked_fill(args[2], float("-inf")), -1, dtype=torch.float32)
    return self.merge_heads(torch.matmul(probs.to(q.dtype), v))


REWRITES = {
    "sdpa": (tiny.Attention, _sdpa_attention),
    "rms_norm": (tiny.RMSNorm, _fused_rms_norm),
    "spelling": (tiny.Attention, _transposed_the_other_way),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("level", ["mix", "op", "module"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rewrite", list(REWRITES))
def test_an_equivalent_rewrite_is_noise(
    mode: str,
    level: str,
    dtype: torch.dtype,
    rewrite: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    golden = dump_llama(tmp_path / "g", build_tiny_llama(CONFIG, dtype=dtype), mode, level)
    monkeypatch.setattr(*REWRITES[rewrite][:1], "forward", REWRITES[rewrite][1])
    target = dump_llama(tmp_path / "t", build_tiny_llama(CONFIG, dtype=dtype), mode, level)
    result, culprits = judged_in_shards(golden, target)
    assert result.first_divergence is None, render(result)
    assert culprits == [], culprits[0].reason  # no shard of --precision-compare fails


@pytest.mark.parametrize("mode", MODES)
def test_a_lost_residual_is_found_where_the_golden_adds_it(
    dumps: Callable[..., Path], mode: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    golden = dumps(mode)
    layer = tiny.DecoderLayer.forward

    def lose_it_in_layer_1(self: tiny.DecoderLayer, *args: Any) -> Any:
        broken = self is model.model.layers[1]
        return (_without_attention_residual if broken else layer)(self, *args)

    monkeypatch.setattr(tiny.DecoderLayer, "forward", lose_it_in_layer_1)
    model = build_tiny_llama(CONFIG)
    result = compare_dumps(golden, dump_llama(tmp_path / "t", model, mode))
    d = result.first_divergence
    assert d is not None
    assert (d.cause, d.layer) == ("unmatched", "model.layers.1")
    assert "(in model.layers.1), a call the target does not make" in d.reason
    assert [(u.side, u.module) for u in result.unmatched] == [("golden", "model.layers.1")]


@pytest.mark.parametrize("mode", MODES)
def test_a_norm_computed_in_bf16_is_a_dtype_slip(
    dumps: Callable[..., Path], mode: str, tmp_path: Path
) -> None:
    """Layer 1's input norm computes in bf16 inside an fp32 model: its ops run in a dtype the
    run does not explain, and what leaves the norm differs by more than reordered rounding."""
    model = build_tiny_llama(CONFIG)
    norm = model.model.layers[1].input_layernorm

    def bf16_norm(x: torch.Tensor) -> torch.Tensor:
        low = x.to(torch.bfloat16)
        low = low * torch.rsqrt(low.pow(2).mean(-1, keepdim=True) + norm.eps)
        return norm.weight * low.to(x.dtype)

    norm.forward = bf16_norm  # type: ignore[method-assign]
    d = compare_dumps(dumps(mode), dump_llama(tmp_path / "t", model, mode)).first_divergence
    assert d is not None
    assert (d.cause, d.layer) == ("unmatched", "model.layers.1")
    assert "dtype bfloat16 where the golden has float32" in d.reason


def test_a_weight_off_within_the_tolerance_of_bf16_still_fails(tmp_path: Path) -> None:
    """Weights are data: a bf16 port must carry the golden's weights rounded, nothing else."""
    golden = dump_llama(tmp_path / "g", build_tiny_llama(CONFIG), "tensor")
    model = build_tiny_llama(CONFIG, dtype=torch.bfloat16)
    with torch.no_grad():
        model.model.layers[1].mlp.down_proj.weight[3, 5] *= 1.4
    d = compare_dumps(golden, dump_llama(tmp_path / "t", model, "tensor")).first_divergence
    assert d is not None
    assert (d.cause, d.name) == ("source", "Functional.linear.13.forward")
    assert "1 of 10240 weight element(s) differ from the golden's cast to bfloat16" in d.reason


def test_devices_of_two_machines_only_warn(dumps: Callable[..., Path], tmp_path: Path) -> None:
    golden = load_dump(dumps("statistics"))
    moved = [
        dataclasses.replace(r, value="cuda:0") if r.value == "cpu" else r for r in golden.records
    ]
    assert moved != list(golden.records)  # arange(..., device=...) and friends
    target = dataclasses.replace(golden, records=moved)
    result = compare_dumps(golden, target)
    assert result.passed, render(result)
    assert {r.status for r in result.records if "device" in r.reason} == {"warn"}


def test_a_comparison_missing_steps_or_calls_does_not_pass(
    dumps: Callable[..., Path], tmp_path: Path
) -> None:
    model = build_tiny_llama(CONFIG)
    path = tmp_path / "steps"
    with torch.no_grad(), capture(model, path, mode="statistics") as cap:
        model(IDS)
        cap.step()
        model(IDS)
    result = compare_dumps(dumps("statistics"), path)
    assert result.first_divergence is None
    assert not result.complete
    assert not result.passed
    assert "incomplete: step 1 rank 0 is only in the target" in render(result)
    empty = dataclasses.replace(load_dump(path), records=[])
    nothing = compare_dumps(load_dump(path), empty)
    assert (nothing.matched_calls, nothing.passed) == (0, False)
    assert "incomplete: no call of one dump matches" in render(nothing)


def test_a_token_flipped_by_noise_ends_the_judging_without_blame(tmp_path: Path) -> None:
    """bf16 picks another token than fp32 at decode step 3 of this prompt: from step 4 the
    model sees other inputs, which is no call's fault."""
    ids = example_input_ids(CONFIG, seq=8, seed=10)
    models = {"g": build_tiny_llama(CONFIG), "t": build_tiny_llama(CONFIG, dtype=torch.bfloat16)}
    tokens = {}
    for name, model in models.items():
        with torch.no_grad(), capture(model, tmp_path / name, mode="statistics") as cap:
            tokens[name] = greedy_generate(model, ids, 5, on_step=lambda i: i and cap.step())
    first_flip = int((tokens["g"] != tokens["t"]).nonzero()[0, 1]) - ids.shape[1]
    assert first_flip == 3
    result, culprits = judged_in_shards(tmp_path / "g", tmp_path / "t")
    assert result.first_divergence is None, render(result)
    # shards of later steps see other token ids; none blames them on their own records
    assert culprits == [], culprits[0].reason
    assert result.inputs_diverged is not None
    assert (result.inputs_diverged.step, result.inputs_diverged.name) == (
        4,
        "Functional.embedding.0.forward",
    )
    assert "from step 4 on the model's inputs differ" in render(result)


def test_alignment_pairs_long_sequences_around_one_insertion() -> None:
    from pytest_precision.compare._alignment import _matching_blocks

    golden = [("Tensor", "mul", f"layers.{i % 40}", ()) for i in range(20_000)]
    target = [*golden[:7_000], ("Tensor", "mul", "extra", ()), *golden[7_000:]]
    pairs = _matching_blocks(golden, target)  # type: ignore[arg-type]
    assert len(pairs) == len(golden)
    assert pairs[7_000] == (7_000, 7_001)
