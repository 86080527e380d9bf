"""--golden-dir pointing at real dumps: an msprobe dump made by msprobe, and a native capture."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from dump_helpers import MSPROBE_FIXTURES

from pytest_precision import capture

MSPROBE_TEST = """
import pytest
from safetensors.torch import load_file
from pytest_precision import assert_close_to_golden

EXPECTED = load_file({expected!r})  # the same model's plain forward, without msprobe

def test_module_output_by_module_path():
    assert_close_to_golden(EXPECTED["step0/Module.block.Block.forward.0.output.0"], name="block")

def test_record_key():
    key = "Module.head.Linear.forward.0.output.0"
    assert_close_to_golden(EXPECTED["step0/" + key], name=key)

def test_a_wrong_value_fails():
    head = EXPECTED["step0/Module.head.Linear.forward.0.output.0"]
    assert_close_to_golden(head * 1.05, name="head")
"""


def test_msprobe_dump_as_goldens(pytester: pytest.Pytester) -> None:
    dump = MSPROBE_FIXTURES / "l0_tensor"
    pytester.makepyfile(test_npu=MSPROBE_TEST.format(expected=str(dump / "expected.safetensors")))
    result = pytester.runpytest("-p", "no:cacheprovider", "--golden-dir", str(dump))
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["*head*FAIL under the ratio standard*"])


NATIVE_TEST = """
import torch
from pytest_precision import assert_close_to_golden

def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))

def test_layer_outputs_match_the_baseline_dump():
    m = model()
    x = torch.arange(16.0).reshape(2, 8) / 16
    hidden = m[1](m[0](x))
    assert_close_to_golden(hidden, name="1")
    assert_close_to_golden(m[2](hidden), name="2")

def test_a_broken_layer_is_caught():
    m = model()
    x = torch.arange(16.0).reshape(2, 8) / 16
    with torch.no_grad():
        m[2].weight[0, 0] += 0.5  # a wrong weight
    assert_close_to_golden(m(x), name="2")
"""


def test_native_capture_as_goldens(pytester: pytest.Pytester, tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    with capture(model, tmp_path / "baseline", level="module"):
        model(torch.arange(16.0).reshape(2, 8) / 16)
    pytester.makepyfile(test_target=NATIVE_TEST)
    result = pytester.runpytest(
        "-p", "no:cacheprovider", "--golden-dir", str(tmp_path / "baseline")
    )
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*golden mismatch (golden: *baseline record Module.2.Linear.*"])


LAYERS_TEST = """
import pytest
import torch
from pytest_precision import PrecisionInputError, assert_layers_close_to_golden

def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))

def test_the_layer_helper_checks_modules_against_a_dump():
    x = torch.arange(16.0).reshape(2, 8) / 16
    assert_layers_close_to_golden(model(), x, modules=["0", "2"])

def test_logits_against_a_dump_is_an_error_that_says_why():
    with pytest.raises(PrecisionInputError, match="records modules and ops"):
        assert_layers_close_to_golden(model(), torch.ones(2, 8), modules=["0"], logits=True)
"""


def test_the_layer_helper_against_a_native_capture(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    with capture(model, tmp_path / "baseline", level="module"):
        model(torch.arange(16.0).reshape(2, 8) / 16)
    pytester.makepyfile(test_layer_helper_on_a_dump=LAYERS_TEST)
    result = pytester.runpytest(
        "-p", "no:cacheprovider", "--golden-dir", str(tmp_path / "baseline")
    )
    result.assert_outcomes(passed=2)
