"""Golden files: node id -> path, exact round trips of every dtype, validation, atomic writes."""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path, PurePosixPath

import numpy as np
import pytest
import safetensors.torch
import torch
from hypothesis import given
from hypothesis import strategies as st

from pytest_precision import DumpFormatError, PrecisionInputError
from pytest_precision.golden._files import NewerSchemaError, flatten, read_golden, write_golden
from pytest_precision.golden._layout import (
    SCHEMA_VERSION,
    atomic_write,
    golden_relpath,
    golden_scope,
    is_golden_dir,
    list_goldens,
    list_stale_temps,
)


@pytest.mark.parametrize(
    ("nodeid", "expected"),
    [
        (
            "tests/test_model.py::TestX::test_y[bf16-2]",
            "tests/test_model.py/TestX/test_y[bf16-2].safetensors",
        ),
        ("test_a.py::test_b", "test_a.py/test_b.safetensors"),
        ("t.py::test_p[a::b]", "t.py/test_p[a__b]-{}.safetensors"),
        ("../up/t.py::test", "__-{}/up/t.py/test.safetensors"),
    ],
)
def test_golden_relpath_is_readable(nodeid: str, expected: str) -> None:
    path = str(golden_relpath(nodeid))
    pattern = re.escape(expected).replace(r"\{\}", "[0-9a-f]{8}")
    assert re.fullmatch(pattern, path), path


_SAFE_PART = re.compile(r"[A-Za-z0-9_.=+,@()\[\]-]{1,100}")


@given(st.lists(st.text(min_size=0, max_size=300), min_size=2, max_size=2, unique=True))
def test_golden_relpath_is_safe_and_distinct(param_ids: list[str]) -> None:
    paths = [golden_relpath(f"tests/test_m.py::test_f[{p}]") for p in param_ids]
    assert paths[0] != paths[1]
    for path in paths:
        assert path.parts[:2] == ("tests", "test_m.py")
        assert all(_SAFE_PART.fullmatch(part) for part in path.parts)
        assert all(part not in (".", "..") for part in path.parts)


def test_golden_scope_matches_relpath_folders() -> None:
    assert golden_scope(PurePosixPath("tests/test_model.py")) == PurePosixPath(
        "tests/test_model.py"
    )
    assert golden_scope(PurePosixPath("tests")) == PurePosixPath("tests")
    nodeid_path = golden_relpath("tests/test_model.py::test_x")
    assert golden_scope(PurePosixPath("tests/test_model.py")) in nodeid_path.parents


DTYPES = [
    torch.float64,
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.float8_e4m3fn,
    torch.float8_e5m2,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.bool,
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_dtype_round_trips_bit_for_bit(tmp_path: Path, dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(0)
    values = torch.randn(3, 7, generator=generator, dtype=torch.float64) * 100
    values[0, :3] = torch.tensor([float("nan"), float("inf"), -0.0])
    tensor = values.to(dtype)
    path = tmp_path / "g.safetensors"
    write_golden(path, {"x": flatten(tensor, "x")}, {"torch": "test"})
    loaded = read_golden(path).value("x")
    assert loaded.dtype == dtype
    assert loaded.shape == tensor.shape
    assert loaded.view(torch.uint8).equal(tensor.view(torch.uint8))


@dataclasses.dataclass
class _Output:
    logits: torch.Tensor
    cache: tuple[torch.Tensor, ...]


def test_nested_values_round_trip(tmp_path: Path) -> None:
    value = {
        "out": _Output(torch.ones(2), (torch.zeros(1), torch.arange(3))),
        1: [np.float32(2.5), 3, None, np.arange(4, dtype=np.int16)],
        "empty": torch.empty(0, 5),
    }
    path = tmp_path / "g.safetensors"
    write_golden(path, {"v": flatten(value, "v")}, {})
    loaded = read_golden(path).value("v")
    assert list(loaded) == ["out", 1, "empty"]
    assert type(loaded["out"]).__name__ == "_Output"
    assert loaded["out"].logits.equal(torch.ones(2))
    assert isinstance(loaded["out"].cache, tuple)
    assert loaded["out"].cache[1].equal(torch.arange(3))
    assert loaded[1][0].item() == 2.5
    assert loaded[1][1].item() == 3
    assert loaded[1][2] is None
    assert loaded[1][3].dtype == torch.int16
    assert loaded["empty"].shape == (0, 5)


def test_flatten_copies_so_later_edits_do_not_leak(tmp_path: Path) -> None:
    tensor = torch.ones(4)
    entry = flatten(tensor[::2], "x")
    tensor.fill_(7)
    assert entry.tensors["x"].equal(torch.ones(2))


def test_unstorable_values_are_rejected_with_their_path() -> None:
    with pytest.raises(PrecisionInputError, match=r"v\['a'\]: cannot store a value of type str"):
        flatten({"a": "text"}, "v")
    with pytest.raises(PrecisionInputError, match="dict key of type tuple"):
        flatten({(1, 2): torch.ones(1)}, "v")


def _corrupt_cases(path: Path) -> dict[str, bytes]:
    write_golden(path, {"x": flatten(torch.ones(64), "x")}, {})
    good = path.read_bytes()
    return {
        "truncated": good[: len(good) // 2],
        "garbage": b"\x00\x01not a golden at all",
        "empty": b"",
    }


@pytest.mark.parametrize("case", ["truncated", "garbage", "empty"])
def test_corrupt_file_is_a_clear_error(tmp_path: Path, case: str) -> None:
    path = tmp_path / "g.safetensors"
    path.write_bytes(_corrupt_cases(path)[case])
    with pytest.raises(DumpFormatError, match="corrupt golden file") as info:
        read_golden(path)
    assert info.value.path == str(path)


def _write_with_metadata(path: Path, metadata: dict[str, str]) -> None:
    safetensors.torch.save_file({"x": torch.ones(2)}, str(path), metadata=metadata)


def test_plain_safetensors_is_not_a_golden(tmp_path: Path) -> None:
    path = tmp_path / "g.safetensors"
    _write_with_metadata(path, {"other": "1"})
    with pytest.raises(DumpFormatError, match="not a pytest-precision golden"):
        read_golden(path)


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "g.safetensors"
    meta = {"schema": SCHEMA_VERSION + 1, "environment": {}, "values": {"x": {"tensor": "x"}}}
    _write_with_metadata(path, {"pytest_precision.golden": json.dumps(meta)})
    with pytest.raises(NewerSchemaError, match=r"newer pytest-precision \(golden schema 3"):
        read_golden(path)


@pytest.mark.parametrize(
    "values",
    [{"x": {"tensor": "missing"}}, {"x": {"bogus": 1}}, {"x": {"dict": [[1]]}}, []],
)
def test_structure_that_does_not_fit_is_corrupt(tmp_path: Path, values: object) -> None:
    path = tmp_path / "g.safetensors"
    meta = {"schema": SCHEMA_VERSION, "environment": {}, "values": values}
    _write_with_metadata(path, {"pytest_precision.golden": json.dumps(meta)})
    with pytest.raises(DumpFormatError, match="corrupt golden"):
        read_golden(path).value("x")


def test_atomic_write_replaces_and_cleans_up_after_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "sub" / "f.safetensors"
    atomic_write(path, b"old")
    assert path.read_bytes() == b"old"
    assert oct(path.stat().st_mode & 0o777) == oct(0o644)

    def fail(src: str, dst: str) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="disk full"):
        atomic_write(path, b"new")
    assert path.read_bytes() == b"old"
    assert list_stale_temps(tmp_path) == []
    assert list_goldens(tmp_path) == [PurePosixPath("sub/f.safetensors")]


@pytest.mark.parametrize("placeholders", [[".gitkeep"], ["README.md", ".gitignore"], ["README"]])
def test_folder_with_only_placeholders_can_become_a_golden_dir(
    tmp_path: Path, placeholders: list[str]
) -> None:
    for name in placeholders:
        (tmp_path / name).write_text("keep this folder in git\n")
    assert is_golden_dir(tmp_path)
    (tmp_path / "run.json").write_text("{}")
    assert not is_golden_dir(tmp_path)
