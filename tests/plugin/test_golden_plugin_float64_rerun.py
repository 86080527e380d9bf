"""The plugin's float64 rerun at ``--golden-update``: fixtures reused, random inputs repeated,
the random state afterwards untouched, and what each golden's record says."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

TESTS = """
import pytest
import torch

from pytest_precision import assert_close_to_golden

torch.manual_seed(0)


@pytest.fixture
def layer():
    torch.manual_seed(1)
    return torch.nn.Linear(64, 32).to(torch.bfloat16)


def test_unseeded_input(layer):
    x = torch.randn(8, 64, dtype=torch.bfloat16)  # from the global state: the rerun repeats it
    assert_close_to_golden(layer(x).relu().sum(-1))


def test_seeded_input(layer, seeded):
    assert_close_to_golden(layer(torch.randn(8, 64).to(torch.bfloat16)), name="out")


def test_next_draw():  # sees the state test_unseeded_input left, rerun or not
    assert_close_to_golden(torch.randn(16), name="draw")
"""


def _records(pytester: pytest.Pytester, *args: str) -> dict[str, dict]:
    result = pytester.runpytest("--golden-dir", "goldens", "--precision-report", "r.json", *args)
    assert result.ret == 0, result.stdout.str()
    records = json.loads(Path(pytester.path, "r.json").read_text())["comparisons"]
    return {f"{r['test'].split('::')[-1]}/{r['name']}": r for r in records}


def test_the_rerun_repeats_random_inputs_and_leaves_the_random_state(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_rerun=TESTS)
    recorded = _records(pytester, "--golden-update", "-p", "no:randomly")
    kinds = {key: (r.get("envelope") or {}).get("kind") for key, r in recorded.items()}
    assert kinds == {
        "test_unseeded_input/#0": "reference",  # not "model": the rerun drew the same input
        "test_seeded_input/out": "reference",
        "test_next_draw/draw": None,  # created data: no op rounded it
    }
    assert "no op rounded it" in recorded["test_next_draw/draw"]["message"]
    checked = _records(pytester, "-p", "no:randomly")  # draw: the same state as without a rerun
    assert {r["status"] for r in checked.values()} == {"pass"}
    assert checked["test_unseeded_input/#0"]["standard"] == "reference"
