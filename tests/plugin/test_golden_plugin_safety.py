"""No golden is lost, through pytester: colliding test ids, the older layout, what prune may
delete, failed writes and unusable golden directories."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest
import safetensors.torch
import torch

from pytest_precision.golden import _files
from pytest_precision.golden._layout import mark_golden_dir

ONE_VALUE = """
import torch
from pytest_precision import assert_close_to_golden

def test_x():
    assert_close_to_golden(torch.full((3,), {value}), "x")
"""

CLASS_MODULE = """
import torch
from pytest_precision import assert_close_to_golden

class TestA_test:
    def test_b(self):
        assert_close_to_golden(torch.ones(3), "x")
"""

FUNCTION_MODULE = """
import torch
from pytest_precision import assert_close_to_golden

def test_b():
    assert_close_to_golden(torch.zeros(3), "x")
"""


def test_ids_that_shared_a_golden_file_each_get_their_own(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        **{"tests/test_m": CLASS_MODULE, "tests/test_m/TestA_test": FUNCTION_MODULE}
    )
    recorded = pytester.runpytest("--golden-dir", "g", "--golden-update")
    recorded.stdout.fnmatch_lines(["golden update: recorded 2, rewrote 0 value(s)*"])
    assert (pytester.path / "g/tests/test_m.py/TestA_test/test_b.safetensors").is_file()
    assert (pytester.path / "g/tests/test_m/TestA_test.py/test_b.safetensors").is_file()
    pytester.runpytest("--golden-dir", "g").assert_outcomes(passed=2)


def test_a_golden_at_the_older_layout_is_read_then_moved_by_update(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_old=ONE_VALUE.format(value=2.0))
    assert pytester.runpytest("--golden-dir", "g", "--golden-update").ret == 0
    current = pytester.path / "g/test_old.py/test_x.safetensors"
    legacy = pytester.path / "g/test_old/test_x.safetensors"
    legacy.parent.mkdir()
    current.rename(legacy)

    read = pytester.runpytest("--golden-dir", "g", "--golden-prune")
    read.assert_outcomes(passed=1)
    read.stdout.fnmatch_lines(["1 golden(s) read at the older layout's path*", "  test_old/*"])
    read.stdout.no_fnmatch_line("unused goldens*")
    assert legacy.is_file()

    assert pytester.runpytest("--golden-dir", "g", "--golden-update").ret == 0
    assert current.is_file()
    assert not legacy.exists()
    again = pytester.runpytest("--golden-dir", "g")
    again.assert_outcomes(passed=1)
    again.stdout.no_fnmatch_line("*older layout*")


GENERATION_USER = """
def test_gen():
    pass
"""


def test_prune_deletes_only_unused_goldens(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_keep=ONE_VALUE.format(value=1.0), test_gen=GENERATION_USER)
    assert pytester.runpytest("--golden-dir", "g", "--golden-update").ret == 0
    kept = pytester.path / "g/test_keep.py/test_x.safetensors"
    stale = pytester.path / "g/test_keep.py/test_gone.safetensors"
    stale.write_bytes(kept.read_bytes())
    weights = pytester.path / "g/weights.safetensors"
    safetensors.torch.save_file({"w": torch.ones(2)}, str(weights))
    baseline = pytester.path / "g/test_gen.py/test_gen.safetensors.generation.run"
    baseline.mkdir(parents=True)
    (baseline / "run.json").write_text("{}")
    safetensors.torch.save_file({"logprobs": torch.ones(2)}, str(baseline / "logprobs.safetensors"))

    result = pytester.runpytest("--golden-dir", "g", "--golden-prune", "--precision-report=r.json")
    result.stdout.fnmatch_lines(
        [
            "unused goldens (no collected test uses them; deleted):",
            "  test_keep.py/test_gone.safetensors",
            "left alone (*not provably goldens*never deleted):",
            "  weights.safetensors",
        ]
    )
    assert "generation.run" not in result.stdout.str()
    assert not stale.exists()
    assert kept.is_file()
    assert weights.is_file()
    assert (baseline / "logprobs.safetensors").is_file()
    report = json.loads((pytester.path / "r.json").read_text())
    assert report["pruned"] == ["test_keep.py/test_gone.safetensors"]
    assert report["left_alone"] == ["weights.safetensors"]


INCOMPLETE_BASELINE = """
from pytest_precision import assert_same_generation

def test_gen():
    assert_same_generation(None, None, [[1, 2]])
"""


def test_an_incomplete_generation_baseline_fails_clearly(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_gen=INCOMPLETE_BASELINE)
    baseline = pytester.path / "g/test_gen.py/test_gen.safetensors.generation.run"
    baseline.mkdir(parents=True)
    mark_golden_dir(pytester.path / "g")
    run = {"prompt": [[1, 2]], "attention_mask": None, "tokens": [[1, 2, 3]]}
    (baseline / "run.json").write_text(json.dumps(run))
    result = pytester.runpytest("--golden-dir", "g")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["E  *stored generation of this test is incomplete*--golden-update"]
    )
    result.stdout.no_fnmatch_line("*FileNotFoundError*")


def _full_disk(monkeypatch: pytest.MonkeyPatch, golden_dir: Path) -> None:
    """Make golden writes fail: a read-only folder, or for root (which ignores permissions)
    a writer that reports a full disk."""
    if os.geteuid() != 0:
        golden_dir.chmod(0o500)
        return

    def full(path: Path, data: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(_files, "atomic_write", full)


def test_a_failed_golden_write_is_reported_as_failed(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(test_w=ONE_VALUE.format(value=1.0))
    golden_dir = pytester.path / "g"
    assert pytester.runpytest("--golden-dir", "g", "--golden-update").ret == 0
    pytester.makepyfile(test_w=ONE_VALUE.format(value=5.0))
    _full_disk(monkeypatch, golden_dir / "test_w.py")
    try:
        result = pytester.runpytest(
            "--golden-dir", "g", "--golden-update", "--precision-report=r.json"
        )
    finally:
        (golden_dir / "test_w.py").chmod(0o755)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert result.parseoutcomes()["errors"] == 1  # the call "updated", its teardown errors
    result.stdout.fnmatch_lines(
        [
            "*golden update not written: *test_x.safetensors*",
            "ERROR * test_w.py::test_x x: not written (*",
            "golden update: recorded 0, rewrote 0 value(s) in *; FAILED to write 1 value(s)*",
        ]
    )
    (record,) = json.loads((pytester.path / "r.json").read_text())["comparisons"]
    assert (record["status"], record["unwritten"]) == ("error", True)
    pytester.runpytest("--golden-dir", "g").assert_outcomes(failed=1)  # 1.0 is still stored


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--golden-dir", "afile", "--golden-update"], "*--golden-dir */afile is a file"),
        (["--golden-dir", "afile/sub", "--golden-update"], "*cannot create the golden directory*"),
        (["--golden-update"], "*--golden-update and --golden-prune need --golden-dir DIR"),
        (["--golden-prune"], "*--golden-update and --golden-prune need --golden-dir DIR"),
    ],
    ids=["a-file", "cannot-create", "update-without-dir", "prune-without-dir"],
)
def test_unusable_golden_dirs_are_usage_errors(
    pytester: pytest.Pytester, args: list[str], message: str
) -> None:
    pytester.makepyfile(test_w=ONE_VALUE.format(value=1.0))
    (pytester.path / "afile").write_text("not a folder")
    result = pytester.runpytest(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {message}"])
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()


def test_a_missing_golden_dir_option_is_one_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_a=ONE_VALUE.format(value=1.0), test_b=ONE_VALUE.format(value=2.0))
    result = pytester.runpytest("--golden-dir", "nonexist")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["ERROR: --golden-dir */nonexist does not exist: record the goldens*"]
    )
    assert "test_a" not in result.stdout.str()
    assert not (pytester.path / "nonexist").exists()


def test_a_missing_golden_dir_from_the_ini_says_so_once(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\ngolden_dir = nonexist\n")
    pytester.makepyfile(test_a=ONE_VALUE.format(value=1.0), test_b=ONE_VALUE.format(value=2.0))
    result = pytester.runpytest()
    result.assert_outcomes(failed=2)
    lines = [line for line in result.stdout.lines if "does not exist: record the goldens" in line]
    assert len(lines) == 1


def test_a_corrupt_golden_fails_in_a_few_lines_with_the_command_to_re_record(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_w=ONE_VALUE.format(value=1.0))
    assert pytester.runpytest("--golden-dir", "g", "--golden-update").ret == 0
    (pytester.path / "g/test_w.py/test_x.safetensors").write_bytes(b"garbage")
    result = pytester.runpytest("--golden-dir", "g")
    result.assert_outcomes(failed=1)
    failure = result.stdout.str().split(" test_x ", 1)[1].split("golden comparisons")[0]
    assert "corrupt golden file" in failure
    assert "test_w.py::test_x --golden-dir g --golden-update" in failure
    assert "_files.py" not in failure  # the reader's frames are not the user's problem
    assert len(failure.strip().splitlines()) < 15
