"""``pytest-precision compare`` as a process: output, exit status, and the collector left whole."""

from __future__ import annotations

import gc
import subprocess
import sys
from typing import Any

import pytest
from dump_helpers import MSPROBE_FIXTURES

from pytest_precision import Dump, DumpComparison
from pytest_precision.cli import main

GOLDEN = str(MSPROBE_FIXTURES / "tp_golden_tensor")
#: rank 1 scales its partial sum by 1.5 before the all_reduce: a divergence, exit status 1
TARGET = str(MSPROBE_FIXTURES / "tp_rank1_scaled_tensor")
COMMAND = [sys.executable, "-m", "pytest_precision.cli", "compare", GOLDEN, TARGET]


def test_the_process_prints_the_whole_report_and_its_exit_status() -> None:
    """The console script leaves without the interpreter's teardown: what it printed to a pipe
    must still all arrive, and the exit status be main's."""
    result = subprocess.run(COMMAND, capture_output=True, text=True, check=False)
    assert result.returncode == 1, result.stderr
    assert result.stdout.startswith(f"golden:  {GOLDEN} (msprobe")
    assert "first divergence: " in result.stdout
    assert result.stdout.endswith("\n")
    assert "Traceback" not in result.stderr


def test_a_reader_that_stops_early_is_not_an_error() -> None:
    """``pytest-precision compare G G | head -0``: the pipe is closed before the report is
    written; the status stays 0 (no divergence) and nothing is printed about it."""
    command = [*COMMAND[:-1], GOLDEN]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as process:
        assert process.stdout is not None
        assert process.stderr is not None
        process.stdout.close()  # long before the child, still importing torch, writes
        err = process.stderr.read().decode()
    assert (process.returncode, err) == (0, "")


def test_an_in_process_call_leaves_the_collector_as_it_was(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The command freezes what its imports made; a caller in the same process (this test)
    gets every object back under the collector, and the collector on."""
    assert main(["compare", GOLDEN, TARGET]) == 1
    assert "first divergence: " in capsys.readouterr().out
    assert gc.isenabled()
    assert gc.get_freeze_count() == 0


def test_both_dumps_are_read_before_the_comparison_and_kept_from_the_collector(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Later full collections skip the index (frozen once read); a dump that cannot be read
    leaves nothing frozen."""
    from pytest_precision.compare import _dumps

    seen: list[tuple[int, int]] = []
    compare_dumps = _dumps.compare_dumps

    def spy(golden: Dump, target: Dump, **options: Any) -> DumpComparison:
        seen.append((gc.get_freeze_count(), len(golden.records) + len(target.records)))
        return compare_dumps(golden, target, **options)

    monkeypatch.setattr(_dumps, "compare_dumps", spy)
    assert main(["compare", GOLDEN, TARGET]) == 1
    [(frozen, records)] = seen
    assert frozen > records > 0
    assert main(["compare", GOLDEN, "nowhere"]) == 2
    assert "nowhere: no such file or directory" in capsys.readouterr().err
    assert gc.get_freeze_count() == 0
    assert gc.isenabled()
