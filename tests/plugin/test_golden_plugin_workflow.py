"""The goldens plugin's CI workflow end to end, through pytester: record, compare, update,
prune, bad golden files, and the same outcomes under xdist."""

from __future__ import annotations

import json
import re
import shutil

import pytest

MODEL = """
import os

import pytest

from pytest_precision.golden._files import read_golden
import torch

from pytest_precision import assert_close_to_golden


def layer():
    torch.manual_seed(0)
    linear = torch.nn.Linear(16, 8)
    with torch.no_grad():
        out = linear(torch.randn(4, 16))
    return out * (1 + float(os.environ.get("PERTURB", "0")))


def test_linear():
    assert_close_to_golden(layer(), name="linear")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_cast(golden, dtype):
    out = layer().to(dtype)
    golden(out)
    golden({"sum": out.sum(), "rows": [out[0], out[1]]}, "nested")


class TestBlock:
    def test_without_goldens(self):
        pass
"""


@pytest.fixture
def model(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(test_model=MODEL)
    return pytester


def _summary(output: str) -> list[str]:
    """The lines of the golden summary section."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if "golden comparisons" in line)
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("====")), len(lines))
    return lines[start + 1 : end]


def test_ci_workflow(model: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    missing = model.runpytest("--golden-dir", "goldens")
    assert missing.ret == pytest.ExitCode.USAGE_ERROR  # one line at start-up, not per test
    missing.stderr.fnmatch_lines(["ERROR: --golden-dir */goldens does not exist: record the*"])
    (model.path / "goldens").mkdir()
    first = model.runpytest("--golden-dir", "goldens")
    first.assert_outcomes(failed=3, passed=1)
    first.stdout.fnmatch_lines(
        [
            "E       AssertionError: no golden for 'linear' of test_model.py::test_linear: "
            "*goldens/test_model.py/test_linear.safetensors does not exist",
            "E       record it with:",
            "E         python -m pytest test_model.py::test_linear --golden-dir goldens "
            "--golden-update",
        ]
    )

    update = model.runpytest("--golden-dir", "goldens", "--golden-update", "-v")
    assert update.ret == 0
    assert update.parseoutcomes() == {"passed": 1, "updated": 3}
    update.stdout.fnmatch_lines(
        ["*test_model.py::test_linear UPDATED*", "golden update: recorded 5, rewrote 0 value(s)*"]
    )
    goldens = model.path / "goldens"
    assert sorted(str(p.relative_to(goldens)) for p in goldens.rglob("*.safetensors")) == [
        "test_model.py/test_cast[bf16].safetensors",
        "test_model.py/test_cast[f32].safetensors",
        "test_model.py/test_linear.safetensors",
    ]

    model.runpytest("--golden-dir", "goldens").assert_outcomes(passed=4)

    monkeypatch.setenv("PERTURB", "0.001")
    junit = model.path / "junit.xml"
    perturbed = model.runpytest("--golden-dir", "goldens", f"--junitxml={junit}")
    perturbed.assert_outcomes(failed=2, passed=2)  # bf16 absorbs a 1e-3 change, f32 does not
    perturbed.stdout.fnmatch_lines(
        [
            "E       AssertionError: test_model.py::test_linear: golden mismatch *",
            "E       linear: FAIL under the ratio standard (shape (4, 8), float32)",
            "E         worst elements (abs error):",
        ]
    )
    summary = _summary(perturbed.stdout.str())
    assert [line.split()[0] for line in summary] == ["FAIL"] * 2 + ["PASS"] * 2
    assert "precision.golden[linear]" in junit.read_text()
    assert "max_rel_err" in junit.read_text()

    rewrite = model.runpytest("--golden-dir", "goldens", "--golden-update")
    assert rewrite.parseoutcomes() == {"passed": 2, "updated": 2}
    rewrite.stdout.fnmatch_lines(["golden update: recorded 0, rewrote 3 value(s)*"])
    model.runpytest("--golden-dir", "goldens").assert_outcomes(passed=4)


def test_unused_goldens_are_listed_and_pruned(model: pytest.Pytester) -> None:
    model.runpytest("--golden-dir", "goldens", "--golden-update").assert_outcomes(passed=1)
    model.makepyfile(test_model=MODEL.replace("def test_linear", "def test_renamed"))
    stale = "test_model.py/test_linear.safetensors"

    unfiltered = model.runpytest("--golden-dir", "goldens", "-p", "no:cacheprovider")
    unfiltered.stdout.fnmatch_lines(
        [
            "unused goldens (no collected test uses them; delete them with --golden-prune):",
            f"  {stale}",
        ]
    )
    filtered = model.runpytest("--golden-dir", "goldens", "-k", "cast")
    assert "unused goldens" not in filtered.stdout.str()
    by_node = model.runpytest("--golden-dir", "goldens", "test_model.py::test_cast")
    assert "unused goldens" not in by_node.stdout.str()
    refused = model.runpytest("--golden-dir", "goldens", "--golden-prune", "-k", "cast")
    refused.stdout.fnmatch_lines(
        ["--golden-prune deleted nothing: unused goldens need a full run * (deselected tests)"]
    )
    assert (model.path / "goldens" / stale).exists()

    temp = model.path / "goldens/test_model.py/.test_cast[f32].safetensors.k1ll3d.tmp"
    temp.write_bytes(b"left by a killed writer")
    model.runpytest("--golden-dir", "goldens", "--golden-prune", "test_model.py")
    assert not (model.path / "goldens" / stale).exists()
    assert not temp.exists()
    assert (model.path / "goldens/test_model.py/test_cast[f32].safetensors").exists()


BAD_GOLDENS = """
import os
import torch
from pytest_precision import assert_close_to_golden

changed = os.environ.get("CHANGED") == "1"

def test_shape():
    assert_close_to_golden(torch.zeros(3, 2) if changed else torch.zeros(2, 3))

def test_dtype():
    assert_close_to_golden(torch.zeros(3, dtype=torch.float16 if changed else torch.float32))

def test_corrupt():
    assert_close_to_golden(torch.zeros(3))

def test_newer():
    assert_close_to_golden(torch.zeros(3))

def test_fine():
    assert_close_to_golden(torch.zeros(3))
"""


def test_bad_goldens_fail_only_their_test(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(test_bad=BAD_GOLDENS)
    pytester.runpytest("--golden-dir", "g", "--golden-update", "-k", "not newer")
    with monkeypatch.context() as mp:
        mp.setattr("pytest_precision.golden._files.SCHEMA_VERSION", 99)
        pytester.runpytest("--golden-dir", "g", "--golden-update", "-k", "newer")
    # an update leaves the newer golden alone: one failure, no second error at teardown
    pytester.runpytest("--golden-dir", "g", "--golden-update", "-k", "newer").assert_outcomes(
        failed=1
    )
    corrupt = pytester.path / "g/test_bad.py/test_corrupt.safetensors"
    corrupt.write_bytes(corrupt.read_bytes()[:40])
    monkeypatch.setenv("CHANGED", "1")
    result = pytester.runpytest("--golden-dir", "g")
    result.assert_outcomes(failed=4, passed=1)
    output = result.stdout.str()
    assert "value is float32 of shape (3, 2), golden is float32 of shape (2, 3)" in output
    assert "value is float16 of shape (3,), golden is float32 of shape (3,)" in output
    assert "test_corrupt.safetensors: corrupt golden file, not readable as safetensors" in output
    assert "newer pytest-precision (golden schema 99; this version reads schema 2" in output
    summary = _summary(output)
    assert [line.split()[0] for line in summary] == ["ERROR"] * 4 + ["PASS"]


@pytest.mark.slow
def test_xdist_gives_the_serial_outcomes_and_summary(
    model: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorded = model.runpytest_subprocess("-n", "2", "--golden-dir", "goldens", "--golden-update")
    assert recorded.parseoutcomes() == {"passed": 1, "updated": 3}
    recorded.stdout.fnmatch_lines(["golden update: recorded 5, rewrote 0 value(s)*"])
    stale = model.path / "goldens/test_model.py/test_gone.safetensors"
    shutil.copy(stale.with_name("test_linear.safetensors"), stale)

    monkeypatch.setenv("PERTURB", "0.001")
    runs = {}
    for mode, args in {"serial": ["-p", "no:xdist"], "xdist": ["-n", "2"]}.items():
        report = model.path / f"{mode}.json"
        result = model.runpytest_subprocess(
            *args, "--golden-dir", "goldens", f"--precision-report={report}"
        )
        result.assert_outcomes(failed=2, passed=2)
        runs[mode] = (_summary(result.stdout.str()), json.loads(report.read_text()))
    (serial_summary, serial_report), (xdist_summary, xdist_report) = runs.values()
    report_line = re.compile(r"precision report written to .*")
    assert [report_line.sub("", s) for s in serial_summary] == [
        report_line.sub("", s) for s in xdist_summary
    ]
    assert serial_report == xdist_report
    assert xdist_report["unused_goldens"] == ["test_model.py/test_gone.safetensors"]
    assert [c["status"] for c in xdist_report["comparisons"]] == ["fail"] * 2 + ["pass"] * 2


NPU_MODULE = """
import os

import pytest

from pytest_precision.golden._files import read_golden
import torch

from pytest_precision import assert_close_to_golden

if not os.environ.get("HAVE_NPU"):
    pytest.skip("no npu", allow_module_level=True)


def test_npu():
    assert_close_to_golden(torch.ones(3), "y")
"""


@pytest.mark.parametrize(
    ("args", "conftest", "why"),
    [
        ([], "", "modules skipped at collection"),
        (["--ignore=test_npu.py"], "", "the ignored path test_npu.py"),
        (["--ignore-glob=*npu*"], "", "the ignored path test_npu.py"),
        (["--deselect=test_npu.py::test_npu"], "", "deselected tests"),
        ([], "collect_ignore = ['test_npu.py']", "the ignored path test_npu.py"),
    ],
    ids=["module-skip", "ignore", "ignore-glob", "deselect", "collect_ignore"],
)
def test_goldens_of_tests_left_out_of_collection_are_never_pruned(
    model: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
    args: list[str],
    conftest: str,
    why: str,
) -> None:
    model.makepyfile(test_npu=NPU_MODULE)
    monkeypatch.setenv("HAVE_NPU", "1")
    assert model.runpytest("--golden-dir", "goldens", "--golden-update").ret == 0
    monkeypatch.delenv("HAVE_NPU")
    if args and "deselect" in args[0]:
        monkeypatch.setenv("HAVE_NPU", "1")
    model.makeconftest(conftest)
    npu_golden = model.path / "goldens" / "test_npu.py" / "test_npu.safetensors"
    assert npu_golden.is_file()

    result = model.runpytest("--golden-dir", "goldens", "--golden-prune", *args)
    assert result.ret == 0
    result.stdout.fnmatch_lines([f"--golden-prune deleted nothing: *({why})"])
    result.stdout.no_fnmatch_line("unused goldens*")
    assert npu_golden.is_file()
