"""kill -9 during a golden update leaves every golden file old or new, never torn.

A forked child rewrites the goldens of three tests through the same update path the plugin
uses, and stops at a chosen point of the second test's write (the temp file just created, half
of it written, all of it written but not synced, synced but not renamed, renamed); it tells
the parent so through a pipe and waits there, and the parent kills it with SIGKILL. The kill
lands at that point every time, whatever the machine's load. Fork (not spawn) keeps each case
at milliseconds instead of a torch import.
"""

from __future__ import annotations

import os
import select
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from pytest_precision import Golden
from pytest_precision.golden._files import read_golden
from pytest_precision.golden._layout import golden_relpath, list_stale_temps

TESTS = [f"tests/test_model.py::test_layer[{i}]" for i in range(3)]
#: The write the child is killed in: the second test's (the first is then complete).
KILLED = 1
SHAPE = (128, 1024)
#: Where in ``atomic_write`` the child is killed, in the order the points are reached.
POINTS = ["temp created", "half written", "written, not synced", "synced, not renamed", "renamed"]


def _writer_round(directory: Path, version: int) -> None:
    for test_id in TESTS:
        golden = Golden(directory, test_id, update=True)
        golden(torch.full(SHAPE, float(version)), "x", standard="exact")


def _version(path: Path) -> int:
    value = read_golden(path).value("x")
    assert value.shape == SHAPE
    first = value.flatten()[0]
    assert bool(value.eq(first).all()), f"{path} mixes two versions"
    return int(first)


def _stop_at(point: str, target: str, ready: int) -> None:
    """In the child: make the write of the file named ``target`` stop at ``point``, telling
    the parent through the pipe ``ready`` and waiting there to be killed."""
    real_mkstemp, real_fdopen, real_fsync, real_replace = (
        tempfile.mkstemp,
        os.fdopen,
        os.fsync,
        os.replace,
    )
    armed = False

    def halt() -> None:
        os.write(ready, b"!")
        time.sleep(600)

    class HalfWriter:
        def __init__(self, file: Any) -> None:
            self.file = file

        def write(self, data: bytes) -> None:
            self.file.write(data[: len(data) // 2])
            self.file.flush()
            halt()

        def __getattr__(self, name: str) -> Any:
            return getattr(self.file, name)

        def __enter__(self) -> HalfWriter:
            return self

        def __exit__(self, *exc: object) -> None:
            self.file.close()

    def mkstemp(*args: Any, **kwargs: Any) -> tuple[int, str]:
        nonlocal armed
        fd, name = real_mkstemp(*args, **kwargs)
        armed = Path(name).name.startswith(f".{target}.")
        if armed and point == "temp created":
            halt()
        return fd, name

    def fdopen(fd: int, *args: Any, **kwargs: Any) -> Any:
        file = real_fdopen(fd, *args, **kwargs)
        return HalfWriter(file) if armed and point == "half written" else file

    def fsync(fd: int) -> None:
        if armed and point == "written, not synced":
            halt()
        real_fsync(fd)
        if armed and point == "synced, not renamed":
            halt()

    def replace(src: Any, dst: Any) -> None:
        real_replace(src, dst)
        if armed and point == "renamed":
            halt()

    tempfile.mkstemp, os.fdopen, os.fsync, os.replace = mkstemp, fdopen, fsync, replace  # type: ignore[assignment]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
@pytest.mark.parametrize("point", POINTS)
def test_kill_9_during_update_leaves_old_or_new(point: str, tmp_path: Path) -> None:
    goldens = tmp_path / "goldens"
    _writer_round(goldens, 1)  # version 1 of every golden; imports and kernels warm
    paths = [goldens / golden_relpath(test_id) for test_id in TESTS]
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover  (the child never returns: it is killed)
        try:
            os.close(read_end)
            torch.set_num_threads(1)
            _stop_at(point, paths[KILLED].name, write_end)
            _writer_round(goldens, 2)
        finally:
            os._exit(1)
    os.close(write_end)
    try:
        reached, _, _ = select.select([read_end], [], [], 120)
        assert reached, f"the writer never reached {point!r}"
    finally:
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        os.close(read_end)
    assert os.WIFSIGNALED(status), "the writer died before it was killed"

    renamed = point == "renamed"
    assert [_version(path) for path in paths] == [2, 2 if renamed else 1, 1]
    stale = list_stale_temps(goldens)
    assert len(stale) == (0 if renamed else 1)  # what the kill left behind: its temp file only
    for temp in stale:
        temp.unlink()
    _writer_round(goldens, 3)  # and the next update goes through
    assert [_version(path) for path in paths] == [3, 3, 3]
