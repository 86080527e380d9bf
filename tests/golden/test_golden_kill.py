"""kill -9 during golden updates leaves every golden file old or new, never torn.

A forked child rewrites the goldens of a few tests in a loop through the same update path the
plugin uses; the parent kills it with SIGKILL at random moments and then reads every file back.
Fork (not spawn) keeps each round at milliseconds instead of a torch import.
"""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path

import pytest
import torch

from pytest_precision import Golden
from pytest_precision.golden._files import read_golden
from pytest_precision.golden._layout import golden_relpath, list_stale_temps

KILLS = 60  # at least this many kills...
#: ...and on until this many landed inside a write and every golden was written at least once
#: (timing varies with load: on a busy machine a child may be killed before its third write)
MID_WRITE = 5
MAX_KILLS = 600
TESTS = [f"tests/test_model.py::test_layer[{i}]" for i in range(3)]
SHAPE = (128, 1024)  # 512 KiB of float32: a write takes long enough to be hit mid-way


def _writer(directory: Path, first_version: int) -> None:
    """Rewrite every test's golden with an ever newer version until killed."""
    torch.set_num_threads(1)
    version = first_version
    while True:
        _writer_round(directory, version)
        version += 1


def _writer_round(directory: Path, version: int) -> None:
    for test_id in TESTS:
        golden = Golden(directory, test_id, update=True)
        golden(torch.full(SHAPE, float(version)), "x", standard="exact")


def _version(path: Path) -> int | None:
    if not path.exists():
        return None
    value = read_golden(path).value("x")
    assert value.shape == SHAPE
    first = value.flatten()[0]
    assert bool(value.eq(first).all()), f"{path} mixes two versions"
    return int(first)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_kill_9_during_update_leaves_old_or_new(tmp_path: Path) -> None:
    rng = random.Random(1234)
    # imports and numba's kernel loading happen once here, not in every child: a child killed
    # within 100 ms would otherwise spend its whole life warming up and never write. The second
    # round overwrites, which compares against the old goldens: other kernels.
    for version in range(2):
        _writer_round(tmp_path / "warm-up", version)
    goldens = tmp_path / "goldens"
    paths = [goldens / golden_relpath(test_id) for test_id in TESTS]
    versions: list[int | None] = [None] * len(paths)
    killed_mid_write = 0
    round_ = 0
    while round_ < KILLS or (
        (killed_mid_write < MID_WRITE or None in versions) and round_ < MAX_KILLS
    ):
        round_ += 1
        first_version = 1000 * round_
        pid = os.fork()
        if pid == 0:  # pragma: no cover  (the child never returns: it is killed)
            try:
                _writer(goldens, first_version)
            finally:
                os._exit(1)
        time.sleep(rng.uniform(0.005, 0.1))
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        assert os.WIFSIGNALED(status), "the writer died before it was killed"
        for i, path in enumerate(paths):
            version = _version(path)
            old, new = versions[i], range(first_version, first_version + 1000)
            assert version == old or version in new, f"{path}: version {version}"
            versions[i] = version
        stale = list_stale_temps(goldens)
        killed_mid_write += bool(stale)
        for temp in stale:
            temp.unlink()
    print(f"{round_} kills, {killed_mid_write} inside a write, final versions {versions}")
    assert all(v is not None for v in versions)
    assert killed_mid_write >= MID_WRITE, "too few kills landed inside a write to prove anything"
