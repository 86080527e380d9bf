"""Layer goldens through the real path: layer and logit goldens of tiny HF models recorded
with ``pytest --golden-dir D --golden-update``, then checked with ``pytest --golden-dir D``:
an honest port passes every golden, each planted bug fails first at the layer it enters."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

pytest.importorskip("transformers")

import layer_models

INNER = """
import os

import pytest
import torch

import layer_models as lm
from pytest_precision import assert_layers_close_to_golden


@pytest.mark.parametrize("dtype", sorted(lm.DTYPES))
@pytest.mark.parametrize("arch", lm.ARCHS)
def test_layers(arch, dtype):
    model = lm.variant(arch, lm.DTYPES[dtype], os.environ["LAYER_VARIANT"])
    assert_layers_close_to_golden(model, lm.inputs(), dtype=lm.DTYPES[dtype], use_cache=False)
"""

#: Measured by the last run of the test (read by the docs' numbers; also printed with -s).
MEASURED: dict[str, object] = {}


def _run(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, which: str, *args: str):
    monkeypatch.setenv("LAYER_VARIANT", which)
    # -rN: no short summary (pytest prints it untruncated when CI is set, which would repeat
    # every failure message and change the counts below)
    result = pytester.runpytest(
        "-rN", "--golden-dir", "goldens", "--precision-report", "r.json", *args
    )
    report = json.loads(Path(pytester.path, "r.json").read_text())["comparisons"]
    return result, report


@pytest.mark.slow  # about 60 s on 2 cores: 6 pytest runs over 8 models
def test_layer_goldens_pass_honest_ports_and_fail_bugs_at_their_layer(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    start = time.perf_counter()
    monkeypatch.syspath_prepend(os.path.dirname(layer_models.__file__))
    pytester.makepyfile(test_model=INNER)
    tests = len(layer_models.ARCHS) * len(layer_models.DTYPES)
    goldens = tests * (layer_models.LAYERS + 1)

    update, records = _run(pytester, monkeypatch, "golden", "--golden-update")
    assert update.ret == 0, update.stdout.str()
    assert sum(r["status"] == "recorded" for r in records) == goldens
    assert {r["envelope"]["kind"] for r in records} == {"reference"}

    honest = {}
    for which in ("golden", "port"):
        result, records = _run(pytester, monkeypatch, which)
        result.assert_outcomes(passed=tests)
        assert [r["status"] for r in records] == ["pass"] * goldens  # 0 false alarms
        honest[which] = max(r["envelope"]["excess"] for r in records)
    MEASURED["honest worst excess"] = honest

    weakest: dict[str, float] = {}
    for bug in layer_models.BUGS:
        result, records = _run(pytester, monkeypatch, bug)
        result.assert_outcomes(failed=tests)
        by_test: dict[str, dict[str, dict[str, object]]] = {}
        for r in records:
            by_test.setdefault(r["test"], {})[r["name"]] = r
        assert len(by_test) == tests
        for test, named in by_test.items():
            first_block, bug_block = (
                ("transformer.h.0", "transformer.h.1")
                if "gpt2" in test
                else ("model.layers.0", "model.layers.1")
            )
            assert named[first_block]["status"] == "pass", (bug, test)
            assert named[bug_block]["status"] == "fail", (bug, test)
            weakest[bug] = min(
                weakest.get(bug, float("inf")), named[bug_block]["envelope"]["excess"]
            )
        output = result.stdout.str()
        assert output.count(": first failing golden: model.layers.1 (model.layers.0 passed") == 6
        assert output.count(": first failing golden: transformer.h.1 (transformer.h.0 passed") == 2
    MEASURED["weakest bug excess at layer 1"] = weakest
    MEASURED["seconds"] = round(time.perf_counter() - start, 1)
    print(json.dumps(MEASURED, indent=1))
    assert min(weakest.values()) > 1.0
