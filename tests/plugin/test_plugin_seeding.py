"""The seeding fixtures, options and report header, run through pytester."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_precision.runtime._seeds import derive_seed

HERE = Path(__file__).resolve().parents[1]  # tests/: _state.py

#: In-process runs drop and re-import every plugin module they loaded; hypothesis's takes ~2 s.
INNER = ("-p", "no:hypothesispytest", "-p", "no:cacheprovider")

#: Each test records its seed and a digest of a randomly initialized model's output with
#: dropout, so that separate pytest runs can be compared.
MODEL_TESTS = """
import hashlib, json, os, pathlib

import pytest
import torch


@pytest.mark.parametrize("case", range(4))
def test_model(request, seeded, case):
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 32), torch.nn.Dropout(0.5), torch.nn.Linear(32, 4)
    ).train()
    x = torch.randn(3, 8)
    out = model(x)
    assert torch.equal(model(x), out)  # dropout is the identity under `seeded`
    digest = hashlib.sha256(out.detach().numpy().tobytes()).hexdigest()
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    record = {"seed": seeded.seed, "digest": digest, "worker": worker}
    out_dir = pathlib.Path(os.environ["SEED_RECORDS"])
    (out_dir / f"{request.node.name}.json").write_text(json.dumps(record))


def test_dropout_is_random_without_the_fixture():
    model = torch.nn.Dropout(0.5).train()
    x = torch.ones(64)
    assert not torch.equal(model(x), model(x))
"""


def run_model_tests(pytester: pytest.Pytester, *args: str, passed: int) -> dict[str, dict]:
    """Run MODEL_TESTS and return each model test's record by test name."""
    records = pytester.path / "records"
    records.mkdir(exist_ok=True)
    for old in records.glob("*.json"):
        old.unlink()
    pytester.makepyfile(test_model=MODEL_TESTS)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SEED_RECORDS", str(records))
        result = pytester.runpytest(*INNER, *args)
    result.assert_outcomes(passed=passed)
    return {path.stem: json.loads(path.read_text()) for path in records.glob("*.json")}


def outcome(record: dict) -> tuple[int, str]:
    return record["seed"], record["digest"]


@pytest.mark.slow
def test_seeds_and_outputs_are_the_same_serial_under_xdist_and_in_any_order(
    pytester: pytest.Pytester,
) -> None:
    serial = run_model_tests(pytester, passed=5)
    parallel = run_model_tests(pytester, "-n", "2", passed=5)
    reordered = run_model_tests(
        pytester, "test_model.py::test_model[3]", "test_model.py::test_model[1]", passed=2
    )

    assert sorted(serial) == [f"test_model[{case}]" for case in range(4)]
    for name, record in serial.items():
        assert record["seed"] == derive_seed(1234, f"test_model.py::{name}")
    assert {name: outcome(r) for name, r in parallel.items()} == {
        name: outcome(r) for name, r in serial.items()
    }
    assert {record["worker"] for record in parallel.values()} <= {"gw0", "gw1"}
    assert {name: outcome(r) for name, r in reordered.items()} == {
        name: outcome(serial[name]) for name in ("test_model[3]", "test_model[1]")
    }
    assert len({record["digest"] for record in serial.values()}) == 4


def test_session_seed_option_changes_every_test_seed(pytester: pytest.Pytester) -> None:
    default = run_model_tests(pytester, "test_model.py::test_model", passed=4)
    other = run_model_tests(
        pytester, "test_model.py::test_model", "--precision-seed", "7", passed=4
    )
    for name, record in other.items():
        assert record["seed"] == derive_seed(7, f"test_model.py::{name}")
        assert outcome(record) != outcome(default[name])


def test_report_header_shows_the_session_seed_and_devices(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_nothing(): pass")
    result = pytester.runpytest(*INNER, "--precision-seed", "99")
    result.stdout.fnmatch_lines(
        [
            "precision: session seed 99",
            "precision metrics on cpu: *",
            "precision device cpu: * (torch *)",
            "precision device cuda: *",
            "precision device npu: *",
        ]
    )


def test_fixtures_restore_every_state_after_each_test(pytester: pytest.Pytester) -> None:
    pytester.syspathinsert(HERE)
    pytester.makeconftest(
        """
        import pytest
        from _state import changed, global_state

        @pytest.fixture(autouse=True)
        def guard():
            before = global_state()
            yield
            assert changed(before, global_state()) == []
        """
    )
    pytester.makepyfile(
        """
        import os, random
        import numpy as np
        import torch

        def draw():
            return random.random(), np.random.rand(), torch.rand(1)

        def test_seeded(seeded):
            draw()

        def test_deterministic(deterministic):
            assert torch.are_deterministic_algorithms_enabled()
            assert os.environ["HCCL_DETERMINISTIC"] == "TRUE"
            draw()

        def test_both(seeded, deterministic):
            assert seeded.seed == deterministic.seed
            draw()

        def test_leaky_control():
            random.seed(1)  # the guard must catch this one
        """
    )
    result = pytester.runpytest(*INNER)
    result.assert_outcomes(passed=4, errors=1)
    result.stdout.fnmatch_lines(
        ["*ERROR at teardown of test_leaky_control*", "*Left contains one more item: 'random'"]
    )


AUTOSEED_TEST = """
import random
from pytest_precision.runtime._seeds import derive_seed

def test_seeded_without_asking(request):
    expected = random.Random(derive_seed(1234, request.node.nodeid)).random()
    assert random.random() == expected
"""


def test_ini_switch_seeds_every_test(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(AUTOSEED_TEST)
    pytester.runpytest(*INNER).assert_outcomes(failed=1)  # the control: nothing seeds by default
    pytester.makeini("[pytest]\nprecision_autoseed = true\n")
    pytester.runpytest(*INNER).assert_outcomes(passed=1)


def test_a_failing_seeded_test_shows_its_seed(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_fails="def test_fails(seeded):\n    assert False\n")
    result = pytester.runpytest(*INNER)
    seed = derive_seed(1234, "test_fails.py::test_fails")
    result.stdout.fnmatch_lines(
        ["*Captured precision seed setup*", f"{seed} (from --precision-seed 1234)"]
    )
