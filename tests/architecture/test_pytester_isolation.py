"""The suite's own pytester fixture keeps torch importable after an in-process run."""

from __future__ import annotations

from pathlib import Path

import pytest

INNER_TESTS = """
import torch


def test_in_process_run_loads_torch_lazily(pytester):
    # torch.testing.assert_close imports torch.distributed.tensor on first use, after
    # pytester's snapshot of sys.modules was taken
    torch.testing.assert_close(torch.zeros(1), torch.zeros(1))


def test_torch_still_works_afterwards():
    torch.testing.assert_close(torch.zeros(1), torch.zeros(1))
"""


def test_modules_imported_during_an_in_process_run_stay_imported(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest(Path(__file__).resolve().parents[1].joinpath("conftest.py").read_text())
    pytester.makepyfile(test_inner=INNER_TESTS)
    result = pytester.runpytest_subprocess("-p", "pytester", "-p", "no:xdist")
    result.assert_outcomes(passed=2)
