"""Startup cost: with pytest-precision installed, a run that does not use it imports no torch.

Every check runs in a fresh process: this test process has torch imported by the root conftest.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys

import pytest

import pytest_precision
from pytest_precision import plugin

HEAVY = ("torch", "numpy", "safetensors", "numba")

#: Writes, when each process of the run finishes its session, which heavy modules it imported.
#: (A worker's ``pytest_sessionfinish`` runs before it reports back to the xdist controller; its
#: ``pytest_unconfigure`` may still be running when the controller's process exits.)
RECORD_IMPORTS = f"""
import json, os, sys

def pytest_sessionfinish(session):
    heavy = [name for name in {HEAVY!r} if name in sys.modules]
    with open(f"imported-{{os.getpid()}}.json", "w") as f:
        json.dump(heavy, f)
"""


def _imported(pytester: pytest.Pytester) -> list[list[str]]:
    """What each process of the run imported (one list per process: xdist runs several)."""
    return [json.loads(path.read_text()) for path in sorted(pytester.path.glob("imported-*.json"))]


def _python(code: str) -> list[str]:
    """The heavy modules a fresh interpreter has imported after running ``code``."""
    check = f"{code}\nimport sys\nprint([m for m in {HEAVY!r} if m in sys.modules])"
    output = subprocess.run(
        [sys.executable, "-c", check], check=True, capture_output=True, text=True
    ).stdout
    return ast.literal_eval(output.strip().splitlines()[-1])


def test_importing_the_package_or_the_plugin_imports_no_torch() -> None:
    assert _python("import pytest_precision; pytest_precision.__version__") == []
    assert _python("import pytest_precision.plugin") == []
    assert _python("from pytest_precision import PrecisionError") == []


def test_importing_a_stage_namespace_imports_no_torch() -> None:
    stages = ["numerics", "runtime", "golden", "compare", "replay", "output", "diagnosis"]
    stages += ["integrations", "rerun", "report", "dump"]
    assert _python("".join(f"import pytest_precision.{stage}\n" for stage in stages)) == []


def test_a_public_name_imports_what_it_needs() -> None:
    assert "torch" in _python("import pytest_precision; pytest_precision.assert_close")


@pytest.mark.parametrize("args", [[], ["-n", "2"]], ids=["serial", "xdist"])
def test_a_run_that_does_not_use_the_plugin_imports_no_torch(
    pytester: pytest.Pytester, args: list[str]
) -> None:
    pytester.makeconftest(RECORD_IMPORTS)
    pytester.makepyfile("def test_addition():\n    assert 1 + 1 == 2\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", *args)
    result.assert_outcomes(passed=1)
    assert "precision: session seed 1234" in result.stdout.lines
    assert not [line for line in result.stdout.lines if line.startswith("precision device")]
    assert not [line for line in result.stdout.lines if line.startswith("precision metrics")]
    imported = _imported(pytester)
    assert len(imported) == 1 + (2 if args else 0)  # xdist: the controller and two workers
    assert imported == [[]] * len(imported)


SEEDED_TEST = """
import random

def test_seeded(seeded):
    assert random.random() == random.Random(seeded.seed).random()
"""
ASSERT_CLOSE_TEST = """
import torch
from pytest_precision import assert_close

def test_close():
    assert_close(torch.ones(3), torch.ones(3))
"""
DEVICE_LINE = "precision device cpu: * (torch *)"


@pytest.mark.parametrize(
    ("conftest", "test", "lines"),
    [
        # torch not imported at header time: the device lines wait for collection to need it
        ("", SEEDED_TEST, ["collected 1 item", DEVICE_LINE]),
        ("import torch\n", ASSERT_CLOSE_TEST, [DEVICE_LINE, "collected 1 item"]),
    ],
    ids=["seeded-fixture", "conftest-imports-torch"],
)
def test_a_run_using_the_plugin_imports_torch_and_reports_the_devices(
    pytester: pytest.Pytester, conftest: str, test: str, lines: list[str]
) -> None:
    pytester.makeconftest(conftest + RECORD_IMPORTS)
    pytester.makepyfile(test)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["precision: session seed 1234", *lines])
    assert "torch" in _imported(pytester)[0]


def test_a_run_configuring_a_torch_feature_gets_the_devices_in_the_header(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile("def test_addition():\n    assert 1 + 1 == 2\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--precision-seed", "7")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([DEVICE_LINE, "collected 1 item"])


@pytest.mark.parametrize(
    ("args", "configured"),
    [
        ([], False),
        (["--precision-seed", "1234"], False),
        (["--precision-seed", "7"], True),
        (["-o", "precision_autoseed=true"], True),
        (["--golden-dir", "g"], True),
        (["-o", "golden_dir=g"], True),
    ],
)
def test_which_options_need_torch_at_header_time(
    pytester: pytest.Pytester, args: list[str], configured: bool
) -> None:
    pytester.mkdir("g")  # a --golden-dir to read from must exist
    config = pytester.parseconfigure(*args)
    assert plugin._configured(config) is configured


def test_dir_lists_every_public_name_and_unknown_names_raise() -> None:
    assert set(pytest_precision.__all__) <= set(dir(pytest_precision))
    with pytest.raises(AttributeError, match="module 'pytest_precision' has no attribute 'nope'"):
        pytest_precision.nope  # noqa: B018
