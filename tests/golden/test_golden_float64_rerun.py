"""Noise-aware by default, through the real path: plain ``assert_close_to_golden`` of each layer's
output and the logits of bf16 / fp16 models, recorded with ``pytest --golden-dir D
--golden-update`` (which reruns each test in float64 for the references), then checked with
``pytest --golden-dir D``: the honest port passes, a planted bug fails first at its layer.
``benchmarks/golden_float64_rerun.py`` measures the same over six architectures."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

pytest.importorskip("transformers")

import layer_models

INNER = """
import os

import pytest
import torch

import layer_models as lm
from pytest_precision import assert_close_to_golden


@pytest.mark.parametrize("arch,dtype", [("llama", "bf16"), ("gpt2", "fp16")])
def test_layers(arch, dtype):
    model = lm.variant(arch, lm.DTYPES[dtype], os.environ["LAYER_VARIANT"])
    outputs = []
    for block in lm.blocks(model):
        block.register_forward_hook(lambda m, a, out: outputs.append(out))
    with torch.no_grad():
        logits = model(lm.inputs(), use_cache=False).logits
    for i, out in enumerate(outputs + [logits]):
        out = out[0] if isinstance(out, tuple) else out
        assert_close_to_golden(out.to(lm.DTYPES[dtype]), name=f"layer{i}")


def test_asserts_its_dtype():  # the float64 rerun fails this assert: model-level rule
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    out = torch.nn.functional.linear(x, x[:8]).softmax(-1)
    assert out.dtype == torch.bfloat16
    assert_close_to_golden(out, name="probs")
"""


def _run(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, which: str, *args: str):
    monkeypatch.setenv("LAYER_VARIANT", which)
    result = pytester.runpytest(
        "-rN", "--golden-dir", "goldens", "--precision-report", "r.json", *args
    )
    records = json.loads(Path(pytester.path, "r.json").read_text())["comparisons"]
    return result, {(r["test"].split("::")[-1], r["name"]): r for r in records}


@pytest.mark.slow  # about 2 minutes on 2 busy cores: 3 pytest runs
def test_plain_layer_goldens_pass_an_honest_port_and_fail_a_bug_at_its_layer(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(os.path.dirname(layer_models.__file__))
    pytester.makepyfile(test_model=INNER)
    layers = [f"layer{i}" for i in range(layer_models.LAYERS + 1)]
    tests = ["test_layers[llama-bf16]", "test_layers[gpt2-fp16]"]

    update, records = _run(pytester, monkeypatch, "golden", "--golden-update")
    assert update.ret == 0, update.stdout.str()
    assert {records[t, n]["envelope"]["kind"] for t in tests for n in layers} == {"reference"}
    probs = records["test_asserts_its_dtype", "probs"]
    assert probs["envelope"]["kind"] == "model"
    assert "its float64 rerun raised AssertionError" in probs["message"]
    update.stdout.fnmatch_lines(["*probs: no golden yet; model-level envelope (its float64 rerun*"])

    port, records = _run(pytester, monkeypatch, "port")
    port.assert_outcomes(passed=3)  # 0 false alarms: the float32 port, rounded to the dtype
    assert {records[t, n]["status"] for t in tests for n in layers} == {"pass"}

    bug, records = _run(pytester, monkeypatch, "qk_swap")
    bug.assert_outcomes(failed=2, passed=1)
    for test in tests:
        assert records[test, "layer0"]["status"] == "pass"
        assert records[test, "layer1"]["status"] == "fail"
        assert records[test, "layer1"]["envelope"]["excess"] > 1.0
    assert bug.stdout.str().count("first failing golden of this test: layer1 (layer0 passed)") == 2
