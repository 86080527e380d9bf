"""load_dump: layout detection and dispatch, and the errors for what is not a dump."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import numpy as np
import pytest
from dump_helpers import MSPROBE_FIXTURES

from pytest_precision import Dump, DumpFormatError, load_dump


@pytest.fixture
def fake_native(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Stands in for the native reader: any folder holding ``NATIVE`` is native."""
    seen: list[Path] = []
    module = types.ModuleType("pytest_precision.dump._native")

    def is_native_dump(path: Path) -> bool:
        seen.append(path)
        return (path / "NATIVE").exists()

    def read_native_dump(path: Path) -> Dump:
        return Dump(path=path, format="native", records=[])

    module.is_native_dump = is_native_dump  # type: ignore[attr-defined]
    module.read_native_dump = read_native_dump  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module.__name__, module)
    return seen


def test_native_dumps_go_to_the_native_reader(tmp_path: Path, fake_native: list[Path]) -> None:
    (tmp_path / "NATIVE").touch()
    np.save(tmp_path / "shard.npy", np.zeros(2))  # would also pass for a plain folder
    dump = load_dump(str(tmp_path))
    assert dump.format == "native"
    assert fake_native == [tmp_path]


def test_other_layouts_are_asked_of_the_native_reader_first(fake_native: list[Path]) -> None:
    path = MSPROBE_FIXTURES / "l1_md5"
    assert load_dump(path).format == "msprobe"
    assert fake_native == [path]


def test_msprobe_wins_over_stray_tensor_files() -> None:
    # fixture roots also hold expected.safetensors next to the step folders
    assert load_dump(MSPROBE_FIXTURES / "l0_tensor").format == "msprobe"


def test_plain_folder(tmp_path: Path) -> None:
    np.save(tmp_path / "a.npy", np.zeros(2))
    assert load_dump(tmp_path).format == "plain"


def test_missing_path(tmp_path: Path) -> None:
    with pytest.raises(DumpFormatError, match="no such file or directory"):
        load_dump(tmp_path / "nowhere")


def test_empty_folder(tmp_path: Path) -> None:
    with pytest.raises(DumpFormatError, match="empty folder") as info:
        load_dump(tmp_path)
    assert info.value.path == str(tmp_path)


def test_unknown_layout(tmp_path: Path) -> None:
    (tmp_path / "README.txt").write_text("not a dump")
    with pytest.raises(DumpFormatError, match="unknown dump layout"):
        load_dump(tmp_path)


def test_unknown_file_type(tmp_path: Path) -> None:
    (tmp_path / "x.bin").write_bytes(b"\0" * 8)
    with pytest.raises(DumpFormatError, match="unknown dump file type"):
        load_dump(tmp_path / "x.bin")


def test_step_folder_without_ranks_is_incomplete(tmp_path: Path) -> None:
    (tmp_path / "step0" / "rank0").mkdir(parents=True)
    (tmp_path / "step0" / "rank0" / "dump.json").write_text('{"data": {}}')
    (tmp_path / "step1").mkdir()
    with pytest.raises(DumpFormatError, match="incomplete msprobe dump") as info:
        load_dump(tmp_path)
    assert info.value.path == str(tmp_path / "step1")
