"""The direct reader of one-tensor ``.pt`` files, and the readahead of a dump's data files."""

from __future__ import annotations

import io
import os
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from dump_helpers import assert_bitwise_equal, write_pickle_payload

from pytest_precision import load_dump
from pytest_precision.dump import _readahead
from pytest_precision.dump._pt_file import read_pt_tensor
from pytest_precision.dump._readahead import Readahead

TENSORS: dict[str, Callable[[], torch.Tensor]] = {
    "float32 matrix": lambda: torch.randn(4, 5),
    "0-d": lambda: torch.tensor(2.5),
    "bfloat16 4-d": lambda: torch.randn(2, 3, 4, 5).to(torch.bfloat16),
    "float16": lambda: torch.randn(7).half(),
    "float64": lambda: torch.randn(3, dtype=torch.float64),
    "int64 slice (storage offset)": lambda: torch.arange(10)[2:7],
    "transposed": lambda: torch.randn(4, 3).t(),
    "strided columns": lambda: torch.randn(3, 6)[:, 1::2],
    "bool": lambda: torch.tensor([True, False, True]),
    "uint8": lambda: torch.arange(5, dtype=torch.uint8),
    "complex64": lambda: torch.randn(3, dtype=torch.complex64),
    "nan and inf": lambda: torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0]),
}


@pytest.mark.parametrize("make", TENSORS.values(), ids=TENSORS.keys())
def test_a_saved_tensor_reads_as_torch_load_gives_it(tmp_path: Path, make: Callable) -> None:
    torch.manual_seed(0)
    file = tmp_path / "t.pt"
    torch.save(make(), file)
    expected = torch.load(file, weights_only=True)
    found = read_pt_tensor(file)
    assert found is not None
    assert (found.dtype, found.shape, found.stride()) == (
        expected.dtype,
        expected.shape,
        expected.stride(),
    )
    assert found.storage_offset() == expected.storage_offset()
    assert_bitwise_equal(found, expected)


def test_writing_to_the_tensor_leaves_the_file_alone(tmp_path: Path) -> None:
    file = tmp_path / "t.pt"
    torch.save(torch.zeros(8), file)
    tensor = read_pt_tensor(file)
    assert tensor is not None
    tensor += 1
    assert_bitwise_equal(torch.load(file, weights_only=True), torch.zeros(8))


def _saved(value: object) -> bytes:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def _rewritten(data: bytes, edit: Callable[[str, bytes], bytes | None]) -> bytes:
    """The archive with each member passed through ``edit`` (None: left out)."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(data)) as source, zipfile.ZipFile(out, "w") as target:
        for info in source.infolist():
            content = edit(info.filename, source.read(info))
            if content is not None:
                target.writestr(info, content)
    return out.getvalue()


def _compressed(data: bytes) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(data)) as source, zipfile.ZipFile(out, "w") as target:
        for info in source.infolist():
            target.writestr(info.filename, source.read(info), zipfile.ZIP_DEFLATED)
    return out.getvalue()


OTHER_FILES: dict[str, Callable[[], bytes]] = {
    "a dict of tensors": lambda: _saved({"a": torch.ones(2)}),
    "a list of tensors": lambda: _saved([torch.ones(2)]),
    "a tensor that requires grad": lambda: _saved(torch.ones(2, requires_grad=True)),
    "an empty tensor": lambda: _saved(torch.zeros(0, 3)),
    "a big-endian file": lambda: _rewritten(
        _saved(torch.ones(2)), lambda name, b: b"big" if name.endswith("byteorder") else b
    ),
    "no byte order": lambda: _rewritten(
        _saved(torch.ones(2)), lambda name, b: None if name.endswith("byteorder") else b
    ),
    "a compressed storage": lambda: _compressed(_saved(torch.ones(64))),
    "a storage shorter than its tensor": lambda: _rewritten(
        _saved(torch.ones(4)), lambda name, b: b[:8] if "/data/" in name else b
    ),
    "a truncated file": lambda: _saved(torch.ones(1000))[:2000],
    "not a zip": lambda: b"\x80\x02garbage",
    "an empty file": lambda: b"",
}


@pytest.mark.parametrize("make", OTHER_FILES.values(), ids=OTHER_FILES.keys())
def test_anything_but_one_plain_tensor_is_left_to_torch_load(
    tmp_path: Path, make: Callable
) -> None:
    file = tmp_path / "t.pt"
    file.write_bytes(make())
    assert read_pt_tensor(file) is None


def test_a_pickle_payload_is_never_run(tmp_path: Path) -> None:
    marker = tmp_path / "payload-ran"
    file = tmp_path / "t.pt"
    write_pickle_payload(file, marker)
    assert read_pt_tensor(file) is None
    assert not marker.exists()


def test_msprobe_tensors_load_without_torch_load(
    rank_copy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """msprobe writes one plain tensor per file: every one is read directly (torch.load
    costs about half a millisecond a file, a large part of comparing thousands of them)."""
    records = [r for r in load_dump(rank_copy) if r.loader is not None]
    expected = [torch.load(rank_copy / "dump_tensor_data" / f"{r.key}.pt") for r in records]

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("torch.load called")

    monkeypatch.setattr(torch, "load", refuse)
    for record, tensor in zip(records, expected, strict=True):
        assert_bitwise_equal(record.load(), tensor)


# -- readahead ---------------------------------------------------------------------------------


@pytest.fixture
def advised(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The files posix_fadvise(WILLNEED) is called on, in order."""
    calls: list[str] = []
    names: dict[int, str] = {}
    real_open = os.open

    def tracked_open(path: str | os.PathLike[str], flags: int, *args: int) -> int:
        fd = real_open(path, flags, *args)
        names[fd] = Path(path).name
        return fd

    def fadvise(fd: int, offset: int, length: int, advice: int) -> None:
        assert (offset, length, advice) == (0, 0, os.POSIX_FADV_WILLNEED)
        calls.append(names[fd])

    monkeypatch.setattr(_readahead.os, "open", tracked_open)
    monkeypatch.setattr(_readahead.os, "posix_fadvise", fadvise, raising=False)
    return calls


@pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="no posix_fadvise here")
def test_reading_on_in_order_widens_the_window_and_a_jump_narrows_it(
    tmp_path: Path, advised: list[str]
) -> None:
    readahead = Readahead(window_bytes=300, first_window_bytes=100)
    files = [tmp_path / f"{i}.pt" for i in range(8)]
    for file in files:
        file.write_bytes(b"x" * 100)
        readahead.add(file, 100)
    readahead.reading(files[0])  # the first read: the first window
    assert advised == ["0.pt"]
    readahead.reading(files[1])  # on in order: twice as far
    assert advised[1:] == ["1.pt", "2.pt"]
    readahead.reading(files[1])  # the same file again: nothing new
    readahead.reading(files[2])  # as far as the largest window
    assert advised[3:] == ["3.pt", "4.pt"]
    readahead.reading(files[7])  # a jump: the first window again
    readahead.reading(files[6])  # back: already behind what was advised
    readahead.reading(tmp_path / "unknown.pt")
    assert advised[5:] == ["7.pt"]


@pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="no posix_fadvise here")
def test_loading_an_msprobe_record_reads_the_next_data_files_ahead(
    rank_copy: Path, advised: list[str]
) -> None:
    records = [r for r in load_dump(rank_copy) if r.loader is not None]
    assert not advised  # indexing the dump reads nothing ahead
    records[0].load()
    assert advised[: len(records)] == [f"{r.key}.pt" for r in records][: len(advised)]
    assert len(advised) > 1
