"""Masked positions are not compared. Outputs at padding (attention_mask 0)
are never used by the model and follow each dtype's mask constant, so goldens checked with a
mask keep only the real positions (recorded and checked) and say how many they left out."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytest_precision import Golden, PrecisionInputError, float64_reference
from pytest_precision.golden._files import read_golden
from pytest_precision.golden._layout import mark_golden_dir
from pytest_precision.golden._masking import keep_real, mask_of
from pytest_precision.report._goldens import golden_summary_lines

BATCH, SEQ, HIDDEN, PAD = 2, 8, 16, 3


def _mask() -> torch.Tensor:
    mask = torch.ones(BATCH, SEQ, dtype=torch.long)
    mask[1, :PAD] = 0
    return mask


def _values(seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(BATCH, SEQ, HIDDEN, generator=generator).bfloat16()


@pytest.fixture
def gdir(tmp_path: Path) -> Path:
    mark_golden_dir(tmp_path)
    return tmp_path


# ... the masking itself


def test_keep_real_keeps_only_real_positions_of_fitting_tensors() -> None:
    mask = _mask()
    x, other = _values(), torch.arange(5.0)
    kept, left_out = keep_real({"h": x, "scale": other, "n": 3}, mask.bool())
    assert kept["h"].shape == (BATCH * SEQ - PAD, HIDDEN)
    assert torch.equal(kept["h"][:SEQ], x[0])
    assert torch.equal(kept["h"][SEQ:], x[1, PAD:])
    assert kept["scale"] is other
    assert kept["n"] == 3
    assert left_out is not None
    assert (left_out.positions, left_out.of) == (PAD, BATCH * SEQ)
    assert keep_real(other, mask.bool()) == (other, None)
    assert keep_real(x, None) == (x, None)


def test_mask_comes_from_the_models_2d_attention_mask_unless_told() -> None:
    mask = _mask()
    assert torch.equal(mask_of(None, {"attention_mask": mask}), mask.bool())
    assert mask_of(False, {"attention_mask": mask}) is None
    assert mask_of(None, {"attention_mask": torch.ones(BATCH, 1, SEQ, SEQ)}) is None  # 4-D
    assert mask_of(None, {}) is None
    explicit = torch.zeros(BATCH, SEQ, dtype=torch.bool)
    explicit[0, -1] = True
    assert torch.equal(mask_of(explicit, {"attention_mask": mask}), explicit)
    with pytest.raises(PrecisionInputError, match=r"2-D \(batch, seq\) tensor"):
        mask_of(torch.ones(SEQ), {})
    with pytest.raises(PrecisionInputError, match="only 0 and 1"):
        mask_of(torch.full((BATCH, SEQ), 2), {})
    with pytest.raises(PrecisionInputError, match="0 everywhere: no position would be compared"):
        mask_of(torch.zeros(BATCH, SEQ), {})
    with pytest.raises(PrecisionInputError, match="mask=True needs"):
        mask_of(True, {})


# ... goldens with a mask


def test_golden_records_real_positions_and_ignores_padding_values(gdir: Path) -> None:
    mask, x = _mask(), _values()
    Golden(gdir, "t", update=True)(x, "h", mask=mask)
    stored = read_golden(gdir / "t.safetensors").value("h")
    assert stored.shape == (BATCH * SEQ - PAD, HIDDEN)  # the golden holds real positions only

    garbage = x.clone()
    garbage[1, :PAD] = float("nan")
    golden = Golden(gdir, "t")
    comparison = golden(garbage, "h", mask=mask)
    assert comparison is not None
    assert comparison.passed
    assert golden.records[-1]["masked"] == {"left_out": PAD, "positions": BATCH * SEQ}

    wrong = x.clone()
    wrong[1, PAD] += 1.0  # the first real position of the padded row
    golden = Golden(gdir, "t")
    with pytest.raises(AssertionError, match=r"h: 3 of 16 \(batch, seq\) positions left out"):
        golden(wrong, "h", mask=mask)
    assert golden.records[-1]["status"] == "fail"
    assert golden.records[-1]["masked"]["left_out"] == 3


def test_without_a_mask_every_position_counts(gdir: Path) -> None:
    x = _values()
    Golden(gdir, "t", update=True)(x, "h")
    assert read_golden(gdir / "t.safetensors").value("h").shape == x.shape
    garbage = x.clone()
    garbage[1, :PAD] += 1.0
    golden = Golden(gdir, "t")
    with pytest.raises(AssertionError):
        golden(garbage, "h")
    assert "masked" not in golden.records[-1]


def test_a_mask_that_fits_no_tensor_is_a_clear_error(gdir: Path) -> None:
    with pytest.raises(PrecisionInputError, match=r"mask of shape \(2, 8\) fits no tensor"):
        Golden(gdir, "t", update=True)(torch.ones(4, 4), "h", mask=_mask())


def test_summary_line_counts_positions_left_out() -> None:
    masked = {"left_out": 3, "positions": 16}
    record = {"test": "t", "name": "h", "status": "pass", "message": "", "masked": masked}
    lines = golden_summary_lines(
        [record],
        golden_dir=None,
        unused=None,
        pruned=False,
        prune_skipped_because=None,
        report_path=None,
    )
    assert lines == ["PASS      t h (3/16 masked positions left out): "]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    real=st.lists(st.booleans(), min_size=BATCH * SEQ, max_size=BATCH * SEQ).filter(any),
    noise=st.sampled_from([0.0, 1e-3, 1e-2, 1e-1, 1.0]),
    garbage=st.sampled_from([float("nan"), float("inf"), -1e4, 0.0, 7.0]),
    seed=st.integers(0, 2**16),
)
def test_values_at_masked_positions_never_change_the_verdict(
    real: list[bool], noise: float, garbage: float, seed: int
) -> None:
    mask = torch.tensor(real).reshape(BATCH, SEQ)
    golden_value = _values(seed)
    value = (golden_value.double() + noise * _values(seed + 1).double()).bfloat16()
    padded = value.clone()
    padded[~mask] = garbage
    with tempfile.TemporaryDirectory() as directory:
        mark_golden_dir(Path(directory))
        Golden(directory, "t", update=True)(golden_value, "h", mask=mask)
        verdicts = []
        for candidate in (value, padded):
            golden = Golden(directory, "t")
            with contextlib.suppress(AssertionError):
                golden(candidate, "h", mask=mask)
            verdicts.append(golden.records[-1]["status"])
    assert verdicts[0] == verdicts[1]


# ... the float64 reference and the layer helper on a padded batch


def test_float64_reference_has_no_nan_in_a_left_padded_batch() -> None:
    pytest.importorskip("transformers")
    import hf_zoo

    model = hf_zoo.build("llama", torch.bfloat16)
    inputs = hf_zoo.inputs()  # row 1 left-padded: its pad rows are fully masked (float64 NaN)
    out = float64_reference(model, **inputs, use_cache=False).logits
    assert not out.isnan().any()
    pad = int((inputs["attention_mask"][1] == 0).sum())
    alone = {k: v[1:, pad:] for k, v in inputs.items()}
    row = float64_reference(model, **alone, use_cache=False).logits
    # the real positions are those of the row run alone, up to HF eager attention's float32
    # softmax (1e-7 here; bf16 noise is 1e-2)
    torch.testing.assert_close(out[1:, pad:], row, rtol=1e-4, atol=1e-5)


def test_layer_helper_leaves_padding_out_of_goldens(gdir: Path) -> None:
    pytest.importorskip("transformers")
    import hf_zoo

    from pytest_precision import assert_layers_close_to_golden

    inputs = hf_zoo.inputs()
    real = int(inputs["attention_mask"].sum())
    golden = Golden(gdir, "t", update=True)
    assert_layers_close_to_golden(hf_zoo.build("llama", torch.bfloat16), golden=golden, **inputs)
    stored = read_golden(gdir / "t.safetensors")
    assert stored.value("model.layers.0").shape == (real, hf_zoo.HIDDEN)
    assert stored.value("logits").shape == (real, hf_zoo.VOCAB)

    port = hf_zoo.build("llama", torch.bfloat16).float()  # honest: computes in float32
    golden = Golden(gdir, "t")
    assert_layers_close_to_golden(port, golden=golden, dtype=torch.bfloat16, **inputs)
    left_out = inputs["attention_mask"].numel() - real
    assert [r["status"] for r in golden.records] == ["pass"] * 3
    assert {r["masked"]["left_out"] for r in golden.records} == {left_out}

    golden = Golden(gdir, "t")  # mask=False compares the golden's (real) shape with every row
    with pytest.raises(AssertionError, match="golden is"):
        assert_layers_close_to_golden(
            port, golden=golden, dtype=torch.bfloat16, mask=False, **inputs
        )


INNER = """
import os

import pytest
import torch

import layer_models as lm
from pytest_precision import assert_layers_close_to_golden

PAD = 4


def padded():
    ids = lm.inputs().clone()
    mask = torch.ones_like(ids)
    ids[1, :PAD] = 0
    mask[1, :PAD] = 0
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    return {"input_ids": ids, "attention_mask": mask, "position_ids": positions}


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_padded(arch):
    model = lm.variant(arch, torch.bfloat16, os.environ["LAYER_VARIANT"])
    assert_layers_close_to_golden(model, dtype=torch.bfloat16, use_cache=False, **padded())
"""


@pytest.mark.slow  # about 15 s on 2 cores: 4 pytest runs over 2 models
def test_padded_batch_passes_honest_ports_and_fails_bugs_at_their_layer(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("transformers")
    import layer_models

    monkeypatch.syspath_prepend(os.path.dirname(layer_models.__file__))
    pytester.makepyfile(test_model=INNER)

    def run(which: str, *args: str) -> tuple[pytest.RunResult, list[dict]]:
        monkeypatch.setenv("LAYER_VARIANT", which)
        result = pytester.runpytest(
            "-rN", "--golden-dir", "goldens", "--precision-report", "r.json", *args
        )
        report = json.loads(Path(pytester.path, "r.json").read_text())["comparisons"]
        return result, report

    update, records = run("golden", "--golden-update")
    assert update.ret == 0, update.stdout.str()
    goldens = 2 * (layer_models.LAYERS + 1)
    assert [r["status"] for r in records] == ["recorded"] * goldens

    result, records = run("port")
    result.assert_outcomes(passed=2)
    assert [r["status"] for r in records] == ["pass"] * goldens
    assert {r["masked"]["left_out"] for r in records} == {4}
    assert "(4/64 masked positions left out)" in result.stdout.str()

    for bug in ("weight_not_loaded", "qk_swap"):
        result, _ = run(bug)
        result.assert_outcomes(failed=2)
        output = result.stdout.str()
        assert output.count("first failing golden: model.layers.1 (model.layers.0 passed") == 1
        assert output.count("first failing golden: transformer.h.1 (transformer.h.0 passed") == 1
        assert "4 of 64 (batch, seq) positions left out" in output
