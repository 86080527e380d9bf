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

from pytest_precision.diagnosis._noise import NoiseEstimate  # noqa: E402
from pytest_precision.diagnosis._stop import decide, noise_horizon  # noqa: E402
from pytest_precision.diagnosis._workflow import diagnose  # noqa: E402
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
    tmp_path: Path,
) -> None:
    golden = build("llama")
    target = twin(golden)
    module = "model.layers.1.mlp.down_proj"
    with torch.no_grad():
        target.get_submodule(module).weight.mul_(1.05)
    ids = torch.randint(3, 256, (2, 6), generator=torch.Generator().manual_seed(1))
    d = diagnose(golden, target, ids, max_new_tokens=6, out=tmp_path, devices=["cpu"])
    assert d.step == 0
    assert d.culprit_module == module
    assert d.noise is not None
    assert d.noise.method.startswith("float64 rerun")
    assert d.noise.steps == 1  # the stop rule read the prefill's noise only
    # the model's own call (module "") and the suspect layer's calls, nothing of layer 0
    modules = {r.module or "" for r in load_dump(tmp_path / "golden_dump").records}
    assert any(m.startswith("model.layers.1.") for m in modules)
    assert all(m == "" or m.startswith("model.layers.1") for m in modules), modules
    compare = next(s.finding for s in d.steps if s.name == "compare")
    assert "tensors of the suspect layer" in compare
