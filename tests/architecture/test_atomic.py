"""One atomic write for every file the package writes: durable, no temp left, umask's mode."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_precision._atomic import TEMP_SUFFIX, _file_mode, atomic_write


@pytest.fixture
def umask_022() -> Iterator[None]:
    old = os.umask(0o022)
    _file_mode.cache_clear()
    yield
    os.umask(old)
    _file_mode.cache_clear()


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.usefixtures("umask_022")
def test_bytes_replace_the_file_with_the_umask_mode(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "out.json"
    atomic_write(target, b"old")
    atomic_write(target, b"new")
    assert target.read_bytes() == b"new"
    assert _mode(target) == 0o644  # not mkstemp's 0600
    assert [p.name for p in target.parent.iterdir()] == ["out.json"]


@pytest.mark.usefixtures("umask_022")
def test_a_writer_callable_gets_a_temp_path_in_the_same_folder(tmp_path: Path) -> None:
    seen: list[Path] = []

    def write(temp: Path) -> None:
        seen.append(temp)
        temp.write_bytes(b"shard")

    target = tmp_path / "shard-00000.safetensors"
    atomic_write(target, write)
    assert target.read_bytes() == b"shard"
    assert seen[0].parent == tmp_path
    assert seen[0].name.startswith(".shard-00000.safetensors.")
    assert seen[0].name.endswith(TEMP_SUFFIX)
    assert not seen[0].exists()
    assert _mode(target) == 0o644


def test_a_failing_write_keeps_the_old_file_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "golden.safetensors"
    atomic_write(target, b"old")

    def explode(temp: Path) -> None:
        temp.write_bytes(b"half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        atomic_write(target, explode)
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["golden.safetensors"]


def test_the_mode_follows_a_stricter_umask(tmp_path: Path) -> None:
    old = os.umask(0o077)
    _file_mode.cache_clear()
    try:
        atomic_write(tmp_path / "private", b"x")
    finally:
        os.umask(old)
        _file_mode.cache_clear()
    assert _mode(tmp_path / "private") == 0o600


def test_durable_writes_fsync_and_shard_writes_do_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(fd) or real_fsync(fd))
    atomic_write(tmp_path / "manifest.json", b"{}")
    atomic_write(tmp_path / "golden", lambda temp: temp.write_bytes(b"g"))
    assert len(synced) == 2
    atomic_write(tmp_path / "shard", lambda temp: temp.write_bytes(b"s"), durable=False)
    atomic_write(tmp_path / "other", b"o", durable=False)
    assert len(synced) == 2
    assert (tmp_path / "shard").read_bytes() == b"s"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "golden",
        "manifest.json",
        "other",
        "shard",
    ]
