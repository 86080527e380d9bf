"""compare_dumps: alignment, per-record comparison and first-divergence localization, on real
captures of the tiny Llama with injected bugs."""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from replay_helpers import BrokenOp

import examples.tiny_llama as tiny
from examples.tiny_llama import (
    TinyLlamaConfig,
    build_tiny_llama,
    example_input_ids,
    greedy_generate,
)
from pytest_precision import (
    DumpComparison,
    DumpFormatError,
    PrecisionInputError,
    TensorComparison,
    capture,
    compare_dumps,
    load_dump,
)
from pytest_precision.cli import main
from pytest_precision.compare._results import layer_of

REPO = Path(__file__).resolve().parents[2]
CONFIG = TinyLlamaConfig()
IDS = example_input_ids(CONFIG, seq=8)
MODES = ["tensor", "statistics"]


def _dump(path: Path, model: torch.nn.Module, mode: str, level: str = "mix") -> Path:
    with torch.no_grad(), capture(model, path, mode=mode, level=level):
        model(IDS)
    return path


@pytest.fixture(scope="module")
def dumps(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """Capture of the float32 tiny Llama (or a variant) per mode and level, made once."""
    made: dict[tuple[str, str, str], Path] = {}

    def get(mode: str, level: str = "mix", variant: str = "golden") -> Path:
        key = (variant, mode, level)
        if key not in made:
            path = tmp_path_factory.mktemp(f"{variant}-{mode}-{level}")
            made[key] = _dump(path / "dump", VARIANTS[variant](), mode, level)
        return made[key]

    return get


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


def _chunked_rotate_half(x: torch.Tensor) -> torch.Tensor:
    """A RoPE bug written with other ops: the halves are swapped the wrong way round."""
    first, second = x.chunk(2, dim=-1)
    return torch.cat((second, -first), dim=-1)


# -- localization ----------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("level", ["mix", "op", "module"])
def test_identical_runs_do_not_diverge(dumps: Callable[..., Path], mode: str, level: str) -> None:
    golden = dumps(mode, level)
    again = _dump(golden.parent / "again", build_tiny_llama(CONFIG), mode, level)
    result = compare_dumps(golden, again)
    assert result.passed
    assert result.first_divergence is None
    assert result.unmatched == []
    assert result.counts()["fail"] == 0
    assert len(result.records) == len(load_dump(golden))
    assert "no divergence: every compared record is within the standard" in result.report()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("level", ["mix", "module"])
def test_bf16_against_fp32_is_noise(dumps: Callable[..., Path], mode: str, level: str) -> None:
    result = compare_dumps(dumps(mode, level), dumps(mode, level, "bf16"))
    assert result.first_divergence is None, result.report()
    assert result.counts()["fail"] > 0  # differences beyond the standard: carried, not made
    # drifting calls that could not be rerun make the answer "inconclusive", never silently
    verdict = "inconclusive" if result.unverified else "no call is guilty"
    assert verdict in result.report()
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
    result = compare_dumps(golden, _dump(tmp_path / "rope", build_tiny_llama(CONFIG), mode))
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
    target = _dump(tmp_path / "rope", build_tiny_llama(CONFIG), mode, "module")
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
    result = compare_dumps(golden, _dump(tmp_path / "extra", build_tiny_llama(CONFIG), mode))
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


# -- records and reports ---------------------------------------------------------------------------


def test_records_pair_every_slot_with_metrics(dumps: Callable[..., Path]) -> None:
    result = compare_dumps(dumps("tensor"), dumps("tensor", "mix", "bf16"))
    tensors = [r for r in result.records if isinstance(r.metrics, TensorComparison)]
    assert tensors
    weight = next(r for r in result.records if r.slot == "parameters.weight")
    assert (weight.golden_dtype, weight.target_dtype) == ("float32", "bfloat16")
    assert weight.status == "pass"  # an fp32 weight rounded to bf16 passes the bf16 standard
    dtype_args = [r for r in result.records if r.reason.startswith("dtype ")]
    assert dtype_args
    assert {r.status for r in dtype_args} == {"warn"}
    # an fp32 upcast of bf16 data is judged as bf16 data: the call's lowest precision
    upcasts = [r for r in result.records if r.op == "to" and r.slot == "output.0"]
    assert any(r.target_dtype == "float32" and r.status == "pass" for r in upcasts)


def test_report_json_and_csv(dumps: Callable[..., Path], tmp_path: Path) -> None:
    result = compare_dumps(dumps("tensor"), dumps("tensor", "mix", "weight"))
    text = result.report(worst=3)
    lines = text.splitlines()
    assert lines[0].startswith("golden:  ")
    assert "first divergence: Functional.linear.13.forward, step 0 rank 0" in text
    assert "layer: model.layers.1" in text
    assert "metrics: cosine" in text
    assert "worst calls (3 of" in text
    assert len(lines) <= 20
    result.write_json(tmp_path / "out.json")
    document = json.loads((tmp_path / "out.json").read_text())
    assert document["passed"] is False
    assert document["first_divergence"]["module"] == "model.layers.1.mlp.down_proj"
    assert len(document["records"]) == len(result.records)
    result.write_csv(tmp_path / "out.csv")
    with (tmp_path / "out.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(result.records)
    assert {"name", "slot", "status", "cosine", "error_level"} <= set(rows[0])


def test_progress_is_reported_per_call(dumps: Callable[..., Path]) -> None:
    seen: list[tuple[int, int]] = []
    result = compare_dumps(
        dumps("statistics"), dumps("statistics"), progress=lambda *a: seen.append(a)
    )
    total = len(load_dump(dumps("statistics")).calls)
    assert seen == [(i, total) for i in range(1, total + 1)]
    assert result.matched_calls == total


def test_a_standard_applies_to_every_record(dumps: Callable[..., Path]) -> None:
    result = compare_dumps(dumps("tensor"), dumps("tensor", "mix", "bf16"), standard="exact")
    tensors = [r for r in result.records if isinstance(r.metrics, TensorComparison)]
    assert {r.metrics.standard.name for r in tensors} == {"exact"}  # type: ignore[union-attr]


def test_bad_input_is_refused_clearly(dumps: Callable[..., Path], tmp_path: Path) -> None:
    golden = dumps("statistics")
    with pytest.raises(PrecisionInputError, match="unknown standard 'close'"):
        compare_dumps(golden, golden, standard="close")  # type: ignore[arg-type]
    with pytest.raises(PrecisionInputError, match="reference standard needs a float64"):
        compare_dumps(golden, golden, standard="reference")
    with pytest.raises(PrecisionInputError, match="a Dump or a path"):
        compare_dumps(golden, 3)  # type: ignore[arg-type]
    with pytest.raises(DumpFormatError, match="no such file or directory"):
        compare_dumps(golden, tmp_path / "missing")


def test_layer_of_module_paths() -> None:
    assert layer_of("model.layers.12.self_attn.o_proj") == "model.layers.12"
    assert layer_of("transformer.h.3.attn") == "transformer.h.3"
    assert layer_of("encoder.layer.0") == "encoder.layer.0"
    assert layer_of("model.embed_tokens") is None
    assert layer_of(None) is None


# -- command line ----------------------------------------------------------------------------------


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["compare", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_exit_status_and_files(
    dumps: Callable[..., Path], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    golden = str(dumps("statistics"))
    code, out, _ = _cli(capsys, golden, golden)
    assert code == 0
    assert "no divergence" in out
    json_file, csv_file = tmp_path / "c.json", tmp_path / "c.csv"
    weight = str(dumps("statistics", "mix", "weight"))
    args = (golden, weight, "--json", str(json_file), "--csv", str(csv_file), "--worst", "1")
    code, out, _ = _cli(capsys, *args)
    assert code == 1
    assert "first divergence: Functional.linear.13.forward" in out
    assert "worst calls (1 of" in out
    assert json.loads(json_file.read_text())["first_divergence"]["cause"] == "source"
    assert csv_file.read_text().startswith("name,golden_name,kind,op,slot")
    code, out, err = _cli(capsys, golden, str(tmp_path / "missing"))
    assert (code, out) == (2, "")
    assert err.startswith("pytest-precision compare: error: ")


def test_dump_comparison_passed_mirrors_first_divergence(dumps: Callable[..., Path]) -> None:
    result: DumpComparison = compare_dumps(
        dumps("statistics"), dumps("statistics", "mix", "weight")
    )
    assert result.passed is (result.first_divergence is None)
    assert not result.passed


def test_msprobe_dumps_compare_and_localize(tmp_path: Path) -> None:
    """A broken gelu kernel in an msprobe dump: the inputs match, the output does not, and a
    float64 rerun from the recorded input convicts the op."""
    golden = REPO / "fixtures" / "msprobe" / "mix_tensor_steps"
    target = tmp_path / "target"
    shutil.copytree(golden, target)
    for pt in target.glob("step0/*/dump_tensor_data/*GELU.forward.0.output.0.pt"):
        _perturb(pt)
    for pt in target.glob("step0/*/dump_tensor_data/Functional.gelu.0.forward.output.0.pt"):
        _perturb(pt)
    result = compare_dumps(golden, target)
    d = result.first_divergence
    assert d is not None
    assert (d.cause, d.name, d.module, d.step) == (
        "rerun",
        "Functional.gelu.0.forward",
        "block.act",
        0,
    )
    assert result.unmatched == []
    assert compare_dumps(golden, golden).counts()["fail"] == 0


def _perturb(pt: Path) -> None:
    tensor = torch.load(pt, weights_only=True)
    torch.save(tensor * 1.05, pt)


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
    golden = _dump(tmp_path / "g", build_tiny_llama(CONFIG, dtype=dtype), mode, level)
    monkeypatch.setattr(*REWRITES[rewrite][:1], "forward", REWRITES[rewrite][1])
    target = _dump(tmp_path / "t", build_tiny_llama(CONFIG, dtype=dtype), mode, level)
    result = compare_dumps(golden, target)
    assert result.first_divergence is None, result.report()


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
    result = compare_dumps(golden, _dump(tmp_path / "t", model, mode))
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
    d = compare_dumps(dumps(mode), _dump(tmp_path / "t", model, mode)).first_divergence
    assert d is not None
    assert (d.cause, d.layer) == ("unmatched", "model.layers.1")
    assert "dtype bfloat16 where the golden has float32" in d.reason


def test_a_weight_off_within_the_tolerance_of_bf16_still_fails(tmp_path: Path) -> None:
    """Weights are data: a bf16 port must carry the golden's weights rounded, nothing else."""
    golden = _dump(tmp_path / "g", build_tiny_llama(CONFIG), "tensor")
    model = build_tiny_llama(CONFIG, dtype=torch.bfloat16)
    with torch.no_grad():
        model.model.layers[1].mlp.down_proj.weight[3, 5] *= 1.4
    d = compare_dumps(golden, _dump(tmp_path / "t", model, "tensor")).first_divergence
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
    assert result.passed, result.report()
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
    assert "incomplete: step 1 rank 0 is only in the target" in result.report()
    empty = dataclasses.replace(load_dump(path), records=[])
    nothing = compare_dumps(load_dump(path), empty)
    assert (nothing.matched_calls, nothing.passed) == (0, False)
    assert "incomplete: no call of one dump matches" in nothing.report()


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
    result = compare_dumps(tmp_path / "g", tmp_path / "t")
    assert result.first_divergence is None, result.report()
    assert result.inputs_diverged is not None
    assert (result.inputs_diverged.step, result.inputs_diverged.name) == (
        4,
        "Functional.embedding.0.forward",
    )
    assert "from step 4 on the model's inputs differ" in result.report()


def test_alignment_pairs_long_sequences_around_one_insertion() -> None:
    from pytest_precision.compare._alignment import _matching_blocks

    golden = [("Tensor", "mul", f"layers.{i % 40}", ()) for i in range(20_000)]
    target = [*golden[:7_000], ("Tensor", "mul", "extra", ()), *golden[7_000:]]
    pairs = _matching_blocks(golden, target)  # type: ignore[arg-type]
    assert len(pairs) == len(golden)
    assert pairs[7_000] == (7_000, 7_001)
