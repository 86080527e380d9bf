"""load_dump: layout detection and dispatch, and the errors for what is not a dump."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from dump_helpers import MSPROBE_FIXTURES

from pytest_precision import DumpFormatError, load_dump


def test_native_dumps_go_to_the_native_reader(tmp_path: Path) -> None:
    import torch

    from pytest_precision import capture

    model = torch.nn.Linear(2, 2)
    with capture(model, tmp_path / "dump", level="module"):
        model(torch.ones(1, 2))
    np.save(tmp_path / "dump" / "stray.npy", np.zeros(2))  # would also pass for a plain folder
    assert load_dump(tmp_path / "dump").format == "native"


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


def test_a_safetensors_file_replaced_on_disk_is_read_afresh(tmp_path: Path) -> None:
    """Open files are cached (a header is parsed once, not once per tensor), but a file
    rewritten under the same name is never served from the old handle."""
    import os

    import safetensors.torch
    import torch

    from pytest_precision.dump._safe_io import load_safetensors_tensor

    path = tmp_path / "t.safetensors"
    for value in (1.0, 2.0, 3.0):
        temp = tmp_path / "new.safetensors"
        safetensors.torch.save_file({"x": torch.full((4,), value)}, str(temp))
        os.replace(temp, path)
        assert load_safetensors_tensor(path, "x").tolist() == [value] * 4
        assert load_safetensors_tensor(path, "x").tolist() == [value] * 4
