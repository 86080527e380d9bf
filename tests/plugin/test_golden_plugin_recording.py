"""What the goldens plugin records, through pytester: values from racing threads, fixture
teardowns and a pytest.exit, and the seed of the seeded fixture."""

from __future__ import annotations

import pytest

from pytest_precision.golden._files import read_golden

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
    golden = pytester.path / "goldens" / "test_teardown.py" / "test_both.safetensors"
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
    seeded = read_golden(pytester.path / "g/test_seed.py/test_seeded.safetensors")
    unseeded = read_golden(pytester.path / "g/test_seed.py/test_unseeded.safetensors")
    assert seeded.environment["seed"].isdigit()
    assert "seed" not in unseeded.environment


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
    stored = read_golden(pytester.path / "g/test_exit.py/test_stops.safetensors")
    assert list(stored.entries) == ["x"]
