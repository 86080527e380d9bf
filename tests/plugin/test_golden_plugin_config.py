"""How the goldens plugin is configured, through pytester: tolerances from ini files and
markers, the golden directory (missing, a dump, paths with spaces), and usage errors."""

from __future__ import annotations

import pytest


def test_marker_and_ini_tolerances(pytester: pytest.Pytester) -> None:
    pytester.makeini(
        """
        [pytest]
        golden_dir = data/goldens
        precision_tolerances =
            float32: rtol=0.05
        """
    )
    pytester.makepyfile(
        test_tol="""
        import os
        import pytest
        import torch
        from pytest_precision import assert_close_to_golden

        def value():
            return torch.linspace(1, 2, 64) * (1 + float(os.environ.get("PERTURB", "0")))

        def test_ini():
            assert_close_to_golden(value())

        @pytest.mark.precision(standard="exact")
        def test_marker():
            assert_close_to_golden(value())

        @pytest.mark.precision(standard="exact")
        def test_call_wins():
            assert_close_to_golden(value(), rtol=0.05)
        """
    )
    sub = pytester.mkdir("sub")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(sub)
        pytester.runpytest(str(pytester.path), "--golden-update", "--strict-markers")
        mp.setenv("PERTURB", "0.01")
        result = pytester.runpytest(str(pytester.path), "--strict-markers")
    assert (pytester.path / "data/goldens/test_tol.py/test_ini.safetensors").is_file()
    assert not (sub / "data").exists()  # ini paths are relative to the ini file
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["E       #0: FAIL under the exact standard *"])


@pytest.mark.parametrize(
    ("line", "problem"),
    [("float32 rtol=1", "expected 'DTYPE: key=value"), ("float32: rtol=x", "must be a number")],
)
def test_bad_ini_tolerance_is_a_usage_error(
    pytester: pytest.Pytester, line: str, problem: str
) -> None:
    pytester.makeini(f"[pytest]\nprecision_tolerances =\n    {line}\n")
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*precision_tolerances line 1 ({line!r}): *{problem}*"])


def test_golden_without_golden_dir_fails_clearly(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        from pytest_precision import assert_close_to_golden

        def test_fixture(golden):
            pass

        def test_function():
            assert_close_to_golden(1.0)
        """
    )
    result = pytester.runpytest()
    result.assert_outcomes(failed=1, errors=1)
    result.stdout.fnmatch_lines(
        ["E   *PrecisionError: no golden directory: pass --golden-dir DIR*"]
    )
    assert "_golden_plugin.py" not in result.stdout.str()


DUMP_CONFTEST = """
import pytest

from pytest_precision.golden._files import read_golden
import torch

import pytest_precision.dump
from pytest_precision import Dump, Record

def output():
    torch.manual_seed(0)
    return torch.randn(4, 8)

def load_dump(path):
    record = Record(
        name="Module.model.layers.0.mlp.MLP.forward.0", slot="output.0", kind="module",
        op="forward", module="model.layers.0.mlp", dtype="float32", shape=(4, 8),
        loader=output,
    )
    return Dump(path=path, format="native", records=[record])

@pytest.fixture(autouse=True)
def fake_dump_reader(monkeypatch):
    monkeypatch.setattr(pytest_precision.dump, "load_dump", load_dump, raising=False)
"""


def test_golden_dir_can_be_a_dump(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(DUMP_CONFTEST)
    pytester.makepyfile(
        test_npu="""
        from conftest import output
        from pytest_precision import assert_close_to_golden

        def test_module_output():
            assert_close_to_golden(output(), name="model.layers.0.mlp")

        def test_record_key(golden):
            golden(output(), "Module.model.layers.0.mlp.MLP.forward.0.output.0")

        def test_diverges():
            assert_close_to_golden(output() * 2, name="model.layers.0.mlp")
        """
    )
    dump = pytester.mkdir("gpu_dump")
    (dump / "manifest.json").write_text("{}")
    result = pytester.runpytest("--golden-dir", "gpu_dump")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(
        ["*golden mismatch (golden: *gpu_dump record Module.model.layers.0.mlp.MLP.*output.0)"]
    )
    assert "unused goldens" not in result.stdout.str()
    # the hint does not send the user to --golden-update, which a dump refuses (#14)
    result.stdout.fnmatch_lines(["*the golden is a dump (*gpu_dump), which is read-only*"])
    assert "re-record with" not in result.stdout.str()
    assert "device: - (golden)" not in result.stdout.str()
    # one usage error at startup, not a failure per test
    update = pytester.runpytest("--golden-dir", "gpu_dump", "--golden-update")
    assert update.ret == pytest.ExitCode.USAGE_ERROR
    update.stderr.fnmatch_lines(["*--golden-update cannot write into *gpu_dump: it is a dump*"])
    prune = pytester.runpytest("--golden-dir", "gpu_dump", "--golden-prune")
    prune.stdout.fnmatch_lines(
        ["--golden-prune deleted nothing: * (gpu_dump is a dump; dumps are never pruned)"]
    )
    assert (dump / "manifest.json").is_file()


def test_bad_precision_marker_fails_its_test(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest
        from pytest_precision import assert_close_to_golden

        @pytest.mark.precision(tol=1)
        def test_x():
            assert_close_to_golden(1.0)
        """
    )
    pytester.mkdir("g")
    result = pytester.runpytest("--golden-dir", "g", "--strict-markers")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["*@pytest.mark.precision takes only the keywords standard=, rtol=, atol= (got *tol*)"]
    )


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["serial", "xdist"])
def test_collection_errors_and_module_skips_report_normally(
    pytester: pytest.Pytester, workers: list[str]
) -> None:
    """Collect reports carry no user properties: the goldens hooks must not touch them."""
    pytester.makepyfile(
        test_broken='raise ImportError("x")',
        test_skipped='import pytest\npytest.skip("no npu", allow_module_level=True)',
        test_fine="def test_fine():\n    pass",
    )
    result = pytester.runpytest_subprocess("-ra", *workers)
    result.stdout.fnmatch_lines(["*ERROR*test_broken.py*", "SKIPPED*no npu*"])
    result.stdout.no_fnmatch_line("*INTERNALERROR*")
    assert result.ret in (pytest.ExitCode.INTERRUPTED, pytest.ExitCode.TESTS_FAILED)


@pytest.mark.parametrize(
    ("suffix", "content"),
    [
        (".ini", "[pytest]\ngolden_dir = tests/my goldens\n"),
        (".toml", '[tool.pytest.ini_options]\ngolden_dir = "tests/my goldens"\n'),
        (".toml", '[tool.pytest.ini_options]\ngolden_dir = ["tests/my goldens"]\n'),
    ],
    ids=["ini", "toml-string", "toml-list"],
)
def test_ini_golden_dir_may_contain_spaces(
    pytester: pytest.Pytester, suffix: str, content: str
) -> None:
    """The "paths" ini type split 'tests/my goldens' into two folders."""
    name = "pytest" if suffix == ".ini" else "pyproject"
    pytester.makefile(suffix, **{name: content})
    pytester.makepyfile(
        test_a="import torch\nfrom pytest_precision import assert_close_to_golden\n"
        "def test_a():\n    assert_close_to_golden(torch.ones(3), 'x')\n"
    )
    update = pytester.runpytest_subprocess("--golden-update")
    assert update.parseoutcomes()["updated"] == 1
    assert (pytester.path / "tests/my goldens/test_a.py/test_a.safetensors").is_file()
