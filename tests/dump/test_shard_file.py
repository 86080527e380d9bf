"""Dump shards are safetensors files written by this package (the GIL released while their
bytes go out): safetensors and this package's own header check read back every dtype, shape
and byte."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from pytest_precision.dump._safe_io import safetensors_header
from pytest_precision.dump._shard_file import CODES, write_safetensors


def _sample(dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    raw = torch.randint(0, 256, (max(1, torch.Size(shape).numel()) * dtype.itemsize,))
    flat = raw.to(torch.uint8).view(dtype)
    if dtype == torch.bool:
        flat = flat.view(torch.uint8) % 2 == 1
    return flat[: torch.Size(shape).numel()].reshape(shape)


@pytest.mark.parametrize("dtype", sorted(CODES, key=str))
def test_every_dtype_round_trips_bitwise(tmp_path: Path, dtype: torch.dtype) -> None:
    tensors = {
        "0": _sample(dtype, (3, 5)),
        "1": _sample(dtype, ()),
        "2": _sample(dtype, (0, 4)),
        "3": _sample(dtype, (7,)),
    }
    path = tmp_path / "shard.safetensors"
    write_safetensors(path, tensors)
    header = safetensors_header(path)
    with safe_open(path, framework="pt") as f:
        for key, t in tensors.items():
            back = f.get_tensor(key)
            assert back.dtype == t.dtype
            assert back.shape == t.shape
            assert torch.equal(back.view(-1).view(torch.uint8), t.reshape(-1).view(torch.uint8))
            assert header[key][0] == tuple(t.shape)


def test_the_header_is_padded_to_eight_bytes_and_the_data_has_no_gap(tmp_path: Path) -> None:
    path = tmp_path / "shard.safetensors"
    tensors = {"a": torch.ones(3, dtype=torch.float16), "b": torch.arange(5, dtype=torch.int64)}
    write_safetensors(path, tensors)
    data = path.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    assert length % 8 == 0
    assert len(data) == 8 + length + 3 * 2 + 5 * 8


def test_a_big_endian_machine_writes_little_endian_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    t = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    z = torch.tensor([1 + 2j], dtype=torch.complex64)
    monkeypatch.setattr(sys, "byteorder", "big")  # this machine's bytes then read as swapped
    path = tmp_path / "shard.safetensors"
    write_safetensors(path, {"t": t, "z": z})
    data = path.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    body = data[8 + length :]
    assert body[:24] == t.numpy().byteswap().tobytes()
    assert body[24:] == z.view(torch.float32).numpy().byteswap().tobytes()
