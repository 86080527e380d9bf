"""What diagnose leaves out to reach the culprit sooner, without losing it: the float64 noise
rerun covers only the steps the stop rule reads, and when everything before the suspect layer
has the same statistics on both sides, tensors are captured of that layer alone."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from planted import build, twin  # noqa: E402

from pytest_precision.diagnosis import _noise as noise_module  # noqa: E402
from pytest_precision.diagnosis._noise import NoiseEstimate  # noqa: E402
from pytest_precision.diagnosis._results import WeightChange  # noqa: E402
from pytest_precision.diagnosis._stop import decide, noise_horizon  # noqa: E402
from pytest_precision.diagnosis._workflow import _first_weight_layer, diagnose  # noqa: E402
from pytest_precision.dump._load import load_dump  # noqa: E402
from pytest_precision.output._tokens import compare_tokens  # noqa: E402


def _same_tokens(deviations: list[float]) -> tuple[object, torch.Tensor, torch.Tensor]:
    """One row, one step per deviation: both sides take token 1; the target's logprobs are
    the golden's moved by that much."""
    steps = len(deviations)
    g = torch.full((1, steps, 8), -20.0, dtype=torch.float64)
    g[0, :, 1] = -0.1
    t = g.clone()
    for s, d in enumerate(deviations):
        t[0, s, 3] += d
    ids = torch.ones(1, steps, dtype=torch.long)
    tokens = compare_tokens(ids, ids, golden_logprobs=g, target_logprobs=t, logprob_tol=math.inf)
    return tokens, g, t


def _noise(steps: int, value: float = 1e-6) -> NoiseEstimate:
    return NoiseEstimate(((value,) * steps,), "given", torch.float32, torch.float32)


def test_a_departure_within_the_measured_steps_is_decided_on_them() -> None:
    tokens, g, t = _same_tokens([0.0, 0.01, 0.0])
    assert noise_horizon(tokens, g, t) == 2  # up to the first step that differs at all
    decision = decide(tokens, g, t, _noise(2))
    assert decision is not None
    assert (decision.finding, decision.step) == ("logprobs", 1)


def test_a_step_the_noise_does_not_cover_leaves_the_decision_open() -> None:
    tokens, g, t = _same_tokens([1e-7, 0.0, 0.01])
    assert decide(tokens, g, t, _noise(1)) is None  # step 2 could exceed its noise
    decision = decide(tokens, g, t, _noise(3))
    assert decision is not None
    assert (decision.finding, decision.step) == ("logprobs", 2)


def test_bitwise_equal_steps_need_no_noise() -> None:
    tokens, g, t = _same_tokens([0.0, 0.0, 0.0])
    decision = decide(tokens, g, t, _noise(1))
    assert decision is not None
    assert decision.finding == "no difference"


def test_a_prefill_departure_reruns_the_prefill_and_captures_the_suspect_layer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(noise_module, "CEILING_ENVELOPES", 1e12)  # only a rerun can decide
    golden = build("llama")
    target = twin(golden)
    module = "model.layers.0.mlp.down_proj"
    with torch.no_grad():
        target.get_submodule(module).weight.mul_(1.05)
    ids = torch.randint(3, 256, (2, 6), generator=torch.Generator().manual_seed(1))
    d = diagnose(golden, target, ids, max_new_tokens=6, out=tmp_path, devices=["cpu"])
    assert d.step == 0
    assert d.culprit_module == module
    assert d.noise is not None
    assert d.noise.method.startswith("float64 rerun")
    assert d.noise.steps == 1  # the stop rule read the prefill's noise only
    # statistics up to the weight's layer, tensors of that layer alone
    statistics = {r.module or "" for r in load_dump(tmp_path / "golden_statistics").records}
    assert not any(m.startswith("model.layers.1") for m in statistics), statistics
    modules = {r.module or "" for r in load_dump(tmp_path / "golden_dump").records}
    assert any(m.startswith("model.layers.0.") for m in modules)
    assert all(m.startswith("model.layers.0") for m in modules), modules
    found = {s.name: s.finding for s in d.steps}
    bound = "calls up to model.layers.0 (the first layer whose weights differ)"
    assert bound in found["capture (statistics)"]
    assert "tensors of the suspect layer" in found["compare"]
    assert bound not in found["compare"]  # the tensors were not bounded by the weight


def _changed(*names: str) -> tuple[WeightChange, ...]:
    return tuple(WeightChange(name, "mean", 0.0, 1.0) for name in names)


@pytest.mark.parametrize(
    ("names", "layer"),
    [
        (
            ("model.layers.5.mlp.down_proj.weight", "model.layers.3.self_attn.q_proj.weight"),
            "model.layers.3",
        ),
        (("model.layers.1.mlp.experts.0.w1",), "model.layers.1"),
        (("model.layers.2.mlp.down_proj.weight", "lm_head.weight"), None),  # not in a layer
        (("encoder.block.0.w", "decoder.block.1.w"), None),  # two lists of layers
        ((), None),
    ],
)
def test_the_statistics_stop_at_the_first_layer_of_a_differing_weight(
    names: tuple[str, ...], layer: str | None
) -> None:
    assert _first_weight_layer(_changed(*names)) == layer


def test_a_departure_far_beyond_any_noise_needs_no_float64_rerun(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At the float64 floor and at 64 dtype envelopes the stop rule decides alike: no noise
    the rerun could measure would change it, so the rerun (a float64 copy of the model) is
    skipped, and the culprit is localized as before."""
    golden = build("llama")
    target = twin(golden)
    module = "model.layers.0.mlp.down_proj"
    with torch.no_grad():
        target.get_submodule(module).weight.mul_(1.05)
    reruns: list[object] = []
    monkeypatch.setattr(noise_module, "_rerun", lambda *args: reruns.append(args))
    ids = torch.randint(3, 256, (2, 6), generator=torch.Generator().manual_seed(1))
    d = diagnose(golden, target, ids, max_new_tokens=6, out=tmp_path, devices=["cpu"])
    assert reruns == []
    assert d.culprit_module == module
    assert d.noise is not None
    assert d.noise.method.startswith("no float64 rerun")
