"""Goldens' noise envelopes, rule by rule: the reference standard (no warn band), the
model-level rule, perturbation spreads, override precedence, re-measuring, old files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import safetensors.torch
import torch

from pytest_precision import (
    Comparison,
    DumpFormatError,
    Golden,
    PrecisionInputError,
    float64_reference,
)
from pytest_precision.golden._files import read_golden
from pytest_precision.golden._layout import mark_golden_dir
from pytest_precision.golden._tolerances import Tolerance
from pytest_precision.numerics._envelopes import MODEL_MAX_UNITS, MODEL_RMSE_UNITS

N = 4096


def _standards(comparison: Comparison | None) -> set[str]:
    assert comparison is not None
    return {item.comparison.standard.name for item in comparison.items}


def _noise(seed: int) -> torch.Tensor:
    return torch.randn(N, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


@pytest.fixture
def gdir(tmp_path: Path) -> Path:
    mark_golden_dir(tmp_path)
    return tmp_path


@pytest.fixture
def case() -> tuple[torch.Tensor, torch.Tensor]:
    """A float64 reference and a bf16 golden carrying 1 % RMS of its own (multi-op) noise."""
    exact = _noise(0)
    return exact, (exact + 0.01 * _noise(1)).bfloat16()


def _target(exact: torch.Tensor, times: float) -> torch.Tensor:
    """A value whose error against float64 is ``times`` the golden's."""
    return (exact + 0.01 * times * _noise(2)).bfloat16()


def test_reference_envelope_stored_and_round_trips(gdir: Path, case: tuple) -> None:
    exact, golden = case
    Golden(gdir, "t", update=True)(golden, "layer", reference=lambda: exact)
    stored = read_golden(gdir / "t.safetensors")
    entry = stored.entries["layer"]
    assert stored.schema == 2
    assert torch.equal(stored.value("layer").view(torch.int16), golden.view(torch.int16))
    assert entry.references["layer"].dtype == torch.float32  # ample for bf16 noise
    assert entry.envelope["kind"] == "reference"
    assert entry.envelope["limits"] == {"max_abs": 5.0, "mean_abs": 2.0, "rmse": 2.0}
    own = entry.envelope["leaves"]["layer"]["golden_vs_reference"]
    assert own["rmse"] == pytest.approx(0.01, rel=0.05)


def test_one_reference_tensor_for_two_leaves(gdir: Path) -> None:
    """A float64 reference returning one tensor twice (tied outputs): the golden file once
    failed to write, safetensors refusing tensors that share memory."""
    exact = _noise(0)
    Golden(gdir, "t", update=True)((exact.float(), exact.float()), "pair", reference=(exact, exact))
    references = read_golden(gdir / "t.safetensors").entries["pair"].references
    assert len(references) == 2
    assert all(torch.equal(stored, exact) for stored in references.values())


def test_reference_standard_fails_above_limits_without_warn_band(gdir: Path, case: tuple) -> None:
    exact, golden = case
    Golden(gdir, "t", update=True)(golden, "layer", reference=exact)
    check = Golden(gdir, "t")
    assert check(_target(exact, 0.2), "layer").verdict == "pass"  # a more accurate port
    with pytest.raises(AssertionError) as failed:
        Golden(gdir, "t")(_target(exact, 2.4), "layer")  # 1.2x the limit: no longer a warn
    message = str(failed.value)
    assert "x the limit of the reference envelope recorded from float64 rerun" in message
    assert "% beyond it" in message


def test_model_level_rule(gdir: Path, case: tuple) -> None:
    _, golden = case
    u = 2.0**-8
    Golden(gdir, "t", update=True)(golden, "logits", envelope="model")
    assert read_golden(gdir / "t.safetensors").entries["logits"].envelope["kind"] == "model"
    scale = float(golden.double().square().mean().sqrt())
    near = (golden.double() + 0.5 * MODEL_RMSE_UNITS * u * scale * _noise(3)).bfloat16()
    assert _standards(Golden(gdir, "t")(near, "logits")) == {"model"}
    far = (golden.double() + 1.5 * MODEL_RMSE_UNITS * u * scale * _noise(3)).bfloat16()
    with pytest.raises(AssertionError, match="model-level envelope"):
        Golden(gdir, "t")(far, "logits")
    spike = golden.clone()
    spike[0] += 1.2 * MODEL_MAX_UNITS * u * float(golden.abs().max())
    with pytest.raises(AssertionError, match="max abs/max"):
        Golden(gdir, "t")(spike, "logits")


def test_perturbation_envelope(gdir: Path, case: tuple) -> None:
    _, golden = case
    rerun = (golden.double() + 0.002 * _noise(4)).bfloat16()
    Golden(gdir, "t", update=True)(golden, "x", perturbations=[lambda: rerun])
    envelope = read_golden(gdir / "t.safetensors").entries["x"].envelope
    assert envelope["kind"] == "perturbation"
    assert envelope["perturbations"]["factor"] == 4.0
    assert Golden(gdir, "t")((golden.double() + 0.004 * _noise(5)).bfloat16(), "x").passed
    with pytest.raises(AssertionError, match="perturbation envelope"):
        Golden(gdir, "t")((golden.double() + 0.02 * _noise(5)).bfloat16(), "x")


def test_overrides_win_over_the_envelope(gdir: Path, case: tuple) -> None:
    exact, golden = case
    Golden(gdir, "t", update=True)(golden, "layer", reference=exact)
    port = _target(exact, 0.2)  # passes its envelope, fails the one-rounding default
    assert Golden(gdir, "t")(port, "layer").passed
    with pytest.raises(AssertionError):  # the call
        Golden(gdir, "t")(port, "layer", standard="ratio")
    with pytest.raises(AssertionError):  # the precision marker
        Golden(gdir, "t", tolerance=Tolerance("ratio"))(port, "layer")
    with pytest.raises(AssertionError):  # precision_tolerances in the ini
        Golden(gdir, "t", dtype_tolerances={torch.bfloat16: Tolerance(rtol=1e-3)})(port, "layer")
    loose = Golden(gdir, "t", dtype_tolerances={torch.bfloat16: Tolerance(rtol=1.0, atol=2.0)})
    assert _standards(loose(_target(exact, 20), "layer")) == {"allclose"}


def test_update_remeasures_the_envelope(gdir: Path, case: tuple) -> None:
    exact, golden = case
    Golden(gdir, "t", update=True)(golden, "layer", envelope="model")
    update = Golden(gdir, "t", update=True)
    assert update(golden, "layer", reference=exact) is None
    assert update.records[-1]["status"] == "remeasured"
    assert read_golden(gdir / "t.safetensors").entries["layer"].envelope["kind"] == "reference"


def test_first_failing_golden_is_named(gdir: Path, case: tuple) -> None:
    exact, golden = case
    recorder = Golden(gdir, "t", update=True)
    for name in ("a", "b", "c"):
        recorder(golden, name, reference=exact)
    check = Golden(gdir, "t")
    check(golden, "a")
    with pytest.raises(AssertionError, match=r"first failing golden of this test: b \(a passed\)"):
        check(_target(exact, 3), "b")


def test_schema_1_files_still_read(gdir: Path, case: tuple) -> None:
    _, golden = case
    meta = {"schema": 1, "environment": {}, "values": {"x": {"tensor": "x"}}}
    data = safetensors.torch.save(
        {"x": golden}, metadata={"pytest_precision.golden": json.dumps(meta)}
    )
    (gdir / "t.safetensors").write_bytes(data)
    assert _standards(Golden(gdir, "t")(golden, "x")) == {"ratio"}
    multi = (golden.double() * (1 + 0.02 * _noise(6))).bfloat16()
    with pytest.raises(AssertionError, match="envelope='model'"):  # the hint
        Golden(gdir, "t")(multi, "x")
    assert _standards(Golden(gdir, "t")(multi, "x", envelope="model")) == {"model"}


def test_corrupt_envelope_is_a_format_error(gdir: Path, case: tuple) -> None:
    _, golden = case
    meta = {"schema": 2, "environment": {}, "values": {"x": {"tensor": "x"}}, "envelopes": {"x": 3}}
    data = safetensors.torch.save(
        {"x": golden}, metadata={"pytest_precision.golden": json.dumps(meta)}
    )
    (gdir / "t.safetensors").write_bytes(data)
    with pytest.raises(DumpFormatError, match="corrupt golden metadata"):
        read_golden(gdir / "t.safetensors")


def test_float64_reference_leaves_the_model_alone() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
    model = model.bfloat16()
    x = torch.randn(3, 8).bfloat16()
    out, captured = float64_reference(model, x, capture=["1"])
    assert out.dtype == torch.float64
    assert captured["1"].dtype == torch.float64
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    direct = x.double() @ model[0].weight.double().T + model[0].bias.double()
    assert torch.allclose(captured["1"], direct.relu(), rtol=0, atol=1e-12)
    with pytest.raises(PrecisionInputError, match="no module named 'nope'"):
        float64_reference(model, x, capture=["nope"])


def test_bad_envelope_requests(gdir: Path, case: tuple) -> None:
    _, golden = case
    with pytest.raises(PrecisionInputError, match="envelope must be one of"):
        Golden(gdir, "t", update=True)(golden, "x", envelope="loose")
    with pytest.raises(PrecisionInputError, match="needs reference="):
        Golden(gdir, "t", update=True)(golden, "y", envelope="reference")


NET = """
import os

import pytest
import torch

from pytest_precision import assert_layers_close_to_golden


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(64, 64) for _ in range(4))
        self.head = torch.nn.Linear(64, 16)

    def forward(self, x):
        for block in self.blocks:
            x = x + torch.tanh(block(x))
        return self.head(x)


def model():
    torch.manual_seed(0)
    net = Net().bfloat16()
    if os.environ["WHICH"] == "golden":
        return net
    net = net.float()  # the honest port: the same bf16 weights computed in float32
    if os.environ["WHICH"] == "bug":
        with torch.no_grad():
            net.blocks[2].weight[:, 0] = 0.0
    return net


def check():
    net = model()
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(1)).bfloat16()
    dtype = next(net.parameters()).dtype
    assert_layers_close_to_golden(net, x.to(dtype), dtype=torch.bfloat16)


def test_envelope():
    check()


@pytest.mark.precision(standard="ratio")
def test_marker():
    check()
"""


def test_layer_helper_and_overrides_through_the_plugin(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(test_net=NET)
    monkeypatch.setenv("WHICH", "golden")
    update = pytester.runpytest("--golden-dir", "g", "--golden-update")
    assert update.parseoutcomes() == {"updated": 2}
    stored = read_golden(pytester.path / "g/test_net.py/test_envelope.safetensors")
    assert list(stored.entries) == ["blocks.0", "blocks.1", "blocks.2", "blocks.3", "logits"]
    assert {e.envelope["kind"] for e in stored.entries.values()} == {"reference"}

    monkeypatch.setenv("WHICH", "port")
    port = pytester.runpytest("--golden-dir", "g", "-k", "envelope")
    port.assert_outcomes(passed=1)  # the stored envelope
    pytester.runpytest("--golden-dir", "g", "-k", "marker").assert_outcomes(failed=1)
    ini = pytester.runpytest(
        "--golden-dir", "g", "-k", "envelope", "-o", "precision_tolerances=bfloat16: standard=ratio"
    )
    ini.assert_outcomes(failed=1)

    monkeypatch.setenv("WHICH", "bug")
    bug = pytester.runpytest("--golden-dir", "g", "-k", "envelope")
    bug.assert_outcomes(failed=1)
    bug.stdout.fnmatch_lines(
        ["*first failing golden: blocks.2 (blocks.0, blocks.1 passed; blocks.3, logits also fail)"]
    )
    bug.stdout.fnmatch_lines(["*blocks.2: *x the limit of the reference envelope*beyond it)"])

    monkeypatch.setenv("WHICH", "golden")
    again = pytester.runpytest("--golden-dir", "g", "--golden-update", "-k", "envelope")
    again.stdout.fnmatch_lines(["*re-measured the envelope of 5 kept value(s)"])
