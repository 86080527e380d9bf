"""``pytest-precision diagnose`` given the wrong number of saved runs says what it needs."""

from __future__ import annotations

import pytest

from pytest_precision.cli import main


def test_one_saved_run_asks_for_the_second(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diagnose", "runs/gpu"]) == 2
    err = capsys.readouterr().err
    assert "two saved runs, GOLDEN then TARGET (given: runs/gpu)" in err
    assert "not both" not in err


def test_runs_and_an_entry_are_refused_together(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diagnose", "runs/gpu", "runs/npu", "--entry", "m:f"]) == 2
    assert "not both" in capsys.readouterr().err
