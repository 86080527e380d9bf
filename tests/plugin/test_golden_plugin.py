"""The goldens plugin end to end, through pytester: the CI workflow, tolerances, reports, xdist."""

from __future__ import annotations

import json
import re
import shutil

import pytest

from pytest_precision.golden._files import read_golden

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
    first = model.runpytest("--golden-dir", "goldens")
    first.assert_outcomes(failed=3, passed=1)
    first.stdout.fnmatch_lines(
        [
            "E       AssertionError: no golden for 'linear' of test_model.py::test_linear: "
            "*goldens/test_model/test_linear.safetensors does not exist",
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
        "test_model/test_cast[bf16].safetensors",
        "test_model/test_cast[f32].safetensors",
        "test_model/test_linear.safetensors",
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
    stale = "test_model/test_linear.safetensors"

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

    temp = model.path / "goldens/test_model/.test_cast[f32].safetensors.k1ll3d.tmp"
    temp.write_bytes(b"left by a killed writer")
    model.runpytest("--golden-dir", "goldens", "--golden-prune", "test_model.py")
    assert not (model.path / "goldens" / stale).exists()
    assert not temp.exists()
    assert (model.path / "goldens/test_model/test_cast[f32].safetensors").exists()


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
    assert (pytester.path / "data/goldens/test_tol/test_ini.safetensors").is_file()
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
    corrupt = pytester.path / "g/test_bad/test_corrupt.safetensors"
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


@pytest.mark.slow
def test_xdist_gives_the_serial_outcomes_and_summary(
    model: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorded = model.runpytest_subprocess("-n", "2", "--golden-dir", "goldens", "--golden-update")
    assert recorded.parseoutcomes() == {"passed": 1, "updated": 3}
    recorded.stdout.fnmatch_lines(["golden update: recorded 5, rewrote 0 value(s)*"])
    stale = model.path / "goldens/test_model/test_gone.safetensors"
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
    assert xdist_report["unused_goldens"] == ["test_model/test_gone.safetensors"]
    assert [c["status"] for c in xdist_report["comparisons"]] == ["fail"] * 2 + ["pass"] * 2


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
    npu_golden = model.path / "goldens" / "test_npu" / "test_npu.safetensors"
    assert npu_golden.is_file()

    result = model.runpytest("--golden-dir", "goldens", "--golden-prune", *args)
    assert result.ret == 0
    result.stdout.fnmatch_lines([f"--golden-prune deleted nothing: *({why})"])
    result.stdout.no_fnmatch_line("unused goldens*")
    assert npu_golden.is_file()


THREADS = """
import sys
import threading

import pytest

from pytest_precision.golden._files import read_golden
import torch

from pytest_precision import assert_close_to_golden


@pytest.mark.parametrize("i", range(12))
def test_threads(i):
    sys.setswitchinterval(1e-6)
    barrier = threading.Barrier(8)

    def work(k):
        barrier.wait()
        assert_close_to_golden(torch.ones(2) * k, f"v{k}")

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
"""


def test_threads_recording_at_once_keep_every_value(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_threads=THREADS)
    """A racing second golden of the same test used to drop every value as stale."""
    pytester.makepyfile(test_threads=THREADS)
    record = pytester.runpytest_subprocess("--golden-dir", "goldens", "--golden-update")
    assert record.parseoutcomes() == {"updated": 12}
    for _ in range(3):
        update = pytester.runpytest_subprocess("--golden-dir", "goldens", "--golden-update")
        assert update.parseoutcomes() == {"passed": 12}
        for path in (pytester.path / "goldens").rglob("*.safetensors"):
            assert sorted(read_golden(path).entries) == [f"v{k}" for k in range(8)], path


TEARDOWN = """
import pytest
import torch

from pytest_precision import assert_close_to_golden


@pytest.fixture
def checked():
    yield
    assert_close_to_golden(torch.arange(3.0), "final_state")


def test_both(checked):
    assert_close_to_golden(torch.ones(3), "x")


def test_teardown_only(checked):
    pass
"""


def test_values_asserted_in_fixture_teardown_are_kept(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_teardown=TEARDOWN)
    first = pytester.runpytest("--golden-dir", "goldens", "--golden-update", "-v")
    first.stdout.fnmatch_lines(["*::test_both UPDATED*", "*::test_teardown_only UPDATED*"])
    assert first.parseoutcomes() == {"passed": 1, "updated": 2}
    golden = pytester.path / "goldens" / "test_teardown" / "test_both.safetensors"
    assert sorted(read_golden(golden).entries) == ["final_state", "x"]
    again = pytester.runpytest("--golden-dir", "goldens", "--golden-update")
    assert again.parseoutcomes() == {"passed": 2}
    assert sorted(read_golden(golden).entries) == ["final_state", "x"]


def test_golden_records_the_seed_of_the_seeded_fixture(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_seed="""
import torch

from pytest_precision import assert_close_to_golden


def test_seeded(seeded):
    assert_close_to_golden(torch.rand(3), "x")


def test_unseeded():
    assert_close_to_golden(torch.ones(3), "x")
"""
    )
    update = pytester.runpytest("--golden-dir", "g", "--golden-update")
    assert update.parseoutcomes() == {"updated": 2}
    seeded = read_golden(pytester.path / "g/test_seed/test_seeded.safetensors")
    unseeded = read_golden(pytester.path / "g/test_seed/test_unseeded.safetensors")
    assert seeded.environment["seed"].isdigit()
    assert "seed" not in unseeded.environment


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
    assert (pytester.path / "tests/my goldens/test_a/test_a.safetensors").is_file()


def test_values_staged_before_pytest_exit_are_written(pytester: pytest.Pytester) -> None:
    """pytest skips the teardown after an exit, where values are otherwise written."""
    pytester.makepyfile(
        test_exit="""
import pytest
import torch

from pytest_precision import assert_close_to_golden


def test_stops():
    assert_close_to_golden(torch.ones(3), "x")
    pytest.exit("stop")
"""
    )
    pytester.runpytest_subprocess("--golden-dir", "g", "--golden-update")
    stored = read_golden(pytester.path / "g/test_exit/test_stops.safetensors")
    assert list(stored.entries) == ["x"]
