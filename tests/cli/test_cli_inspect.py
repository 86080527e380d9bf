"""``pytest-precision inspect DUMP``: the summary, ``--list [GLOB]``, and one-line errors."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from dump_helpers import MSPROBE_FIXTURES

from pytest_precision.cli import main


def inspect(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[str], str]:
    code = main(["inspect", *args])
    out, err = capsys.readouterr()
    return code, out.splitlines(), err


def test_summary(capsys: pytest.CaptureFixture[str]) -> None:
    code, lines, err = inspect(capsys, str(MSPROBE_FIXTURES / "l1_tensor_ranks"))
    assert (code, err) == (0, "")
    summary = dict(line.split(":", 1) for line in lines)
    assert summary["format"].strip() == "msprobe (task tensor, level L1, framework pytorch)"
    assert summary["ranks"].strip() == "0, 1"
    assert summary["steps"].strip() == "0"
    assert summary["records"].strip() == (
        "48 (44 tensors with data, 0 statistics only, 4 other values)"
    )
    assert summary["by kind"].strip() == "Functional 36, Torch 6, Tensor 6"
    assert summary["dtypes"].strip() == "float32 36, bfloat16 8"
    files = [f for f in (MSPROBE_FIXTURES / "l1_tensor_ranks").rglob("*") if f.is_file()]
    size = sum(f.stat().st_size for f in files)
    assert summary["size"].strip() == f"{size / 1024:.1f} KiB on disk ({len(files)} files)"


def test_summary_of_a_statistics_dump(capsys: pytest.CaptureFixture[str]) -> None:
    _, lines, _ = inspect(capsys, str(MSPROBE_FIXTURES / "l1_md5"))
    assert "records:  24 (0 tensors with data, 22 statistics only, 2 other values)" in lines


def test_list_all_records(capsys: pytest.CaptureFixture[str]) -> None:
    code, lines, _ = inspect(capsys, str(MSPROBE_FIXTURES / "mix_statistics"), "--list")
    assert code == 0
    assert len(lines) == 40
    assert lines[0].split() == [
        "Functional.linear.0.forward",
        "input.0",
        "float32",
        "[3,",
        "4]",
        "max=2.17847",
        "min=-1.01153",
        "mean=0.185321",
        "norm=2.70016",
    ]
    assert "value=-1" in next(line for line in lines if "kwargs.dim" in line)


def test_list_with_a_glob_on_names_or_keys(capsys: pytest.CaptureFixture[str]) -> None:
    dump = str(MSPROBE_FIXTURES / "l1_tensor_ranks")
    _, lines, _ = inspect(capsys, dump, "--list", "Functional.linear.2.*")
    assert len(lines) == 8  # 4 slots on each of 2 ranks
    assert all(line.startswith(("rank 0 step 0", "rank 1 step 0")) for line in lines)
    _, lines, _ = inspect(capsys, dump, "--list", "*.output.0")
    assert len(lines) == 14
    assert all(" output.0 " in line for line in lines)


def test_list_shows_md5_checksums(capsys: pytest.CaptureFixture[str]) -> None:
    _, lines, _ = inspect(capsys, str(MSPROBE_FIXTURES / "l1_md5"), "--list", "Torch.*")
    assert lines[0].endswith("checksum=d25fb18a")


def test_plain_folder(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    np.save(tmp_path / "a.npy", np.zeros((2, 3), dtype=np.float16))
    code, lines, _ = inspect(capsys, str(tmp_path), "--list")
    assert code == 0
    assert lines == ["a  tensor  float16  [2, 3]"]


@pytest.mark.parametrize("problem", ["missing", "malformed"])
def test_bad_dump_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, problem: str
) -> None:
    if problem == "malformed":
        (tmp_path / "dump.json").write_text("{")
        expected = f"{tmp_path / 'dump.json'}: malformed JSON"
    else:
        tmp_path = tmp_path / "nowhere"
        expected = f"{tmp_path}: no such file or directory"
    code, lines, err = inspect(capsys, str(tmp_path))
    assert (code, lines) == (2, [])
    assert err.count("\n") == 1
    assert err.startswith(f"pytest-precision inspect: error: {expected}")


def test_command_line_has_no_traceback(tmp_path: Path) -> None:
    (tmp_path / "dump.json").write_text(json.dumps({"data": {"Torch.add.0.forward": 1}}))
    result = subprocess.run(
        [sys.executable, "-m", "pytest_precision.cli", "inspect", str(tmp_path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().endswith("entry 'Torch.add.0.forward' is not a JSON object")


def test_output_piped_into_a_closed_pipe_is_not_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    class ClosedPipe(io.StringIO):
        def write(self, text: str) -> int:
            raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(sys, "stdout", ClosedPipe())
    monkeypatch.setattr(sys, "stderr", io.StringIO())  # closed by main, like `head` leaves it
    assert main(["inspect", str(MSPROBE_FIXTURES / "l1_tensor_ranks"), "--list"]) == 0


def test_a_native_dump_lists_its_environment_one_key_a_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The recorded environment was one ~900-character line (#14)."""
    import torch

    from pytest_precision import capture

    model = torch.nn.Linear(2, 2)
    with torch.no_grad(), capture(model, tmp_path / "d"):
        model(torch.ones(1, 2))
    assert main(["inspect", str(tmp_path / "d")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert max(len(line) for line in lines) < 200
    assert "recorded environment:" in lines
    assert any(line.startswith("  devices.cpu.available: ") for line in lines)
