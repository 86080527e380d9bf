"""The plain-folder reader: .npy / .npz / .pt / .safetensors files, one record per tensor."""

from __future__ import annotations

from pathlib import Path

import hypothesis.extra.numpy as hnp
import numpy as np
import pytest
import torch
from dump_helpers import assert_bitwise_equal, write_pickle_payload
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file

from pytest_precision import DumpFormatError, load_dump


def test_one_record_per_tensor_in_natural_file_order(tmp_path: Path) -> None:
    torch.manual_seed(0)
    a, b, c, d = (torch.randn(2, 3) for _ in range(4))
    np.save(tmp_path / "x10.npy", a.numpy())
    np.save(tmp_path / "x2.npy", b.numpy())
    np.savez(tmp_path / "arrays.npz", second=c.numpy(), first=d.numpy())
    save_file({"layer.10": a, "layer.9": b}, tmp_path / "weights.safetensors")
    (tmp_path / "sub").mkdir()
    torch.save({"h": [c, d], "step": 3}, tmp_path / "sub" / "state.pt")
    (tmp_path / "notes.txt").write_text("ignored")

    dump = load_dump(tmp_path)

    assert dump.format == "plain"
    assert [r.key for r in dump] == [
        "arrays.first",
        "arrays.second",
        "sub/state.h.0",
        "sub/state.h.1",
        "weights.layer.9",
        "weights.layer.10",
        "x2.tensor",
        "x10.tensor",
    ]
    loaded = {r.key: r.load() for r in dump}
    for key, expected in [
        ("x10.tensor", a),
        ("x2.tensor", b),
        ("arrays.second", c),
        ("arrays.first", d),
        ("weights.layer.10", a),
        ("sub/state.h.1", d),
    ]:
        assert_bitwise_equal(loaded[key], expected)
    record = dump.records[0]
    assert (record.kind, record.op, record.dtype, record.shape) == (
        "File",
        "npz",
        "float32",
        (2, 3),
    )
    assert (record.module, record.parent, record.stats, record.rank, record.step) == (
        None,
        None,
        None,
        0,
        0,
    )


def test_bfloat16_is_kept_by_safetensors_pt_and_ml_dtypes_npy(tmp_path: Path) -> None:
    ml_dtypes = pytest.importorskip("ml_dtypes")
    t = torch.tensor([1.0, -0.0, 3.140625, float("inf"), float("nan"), 1e-40], dtype=torch.bfloat16)
    save_file({"t": t}, tmp_path / "a.safetensors")
    torch.save(t, tmp_path / "b.pt")
    np.save(tmp_path / "c.npy", t.view(torch.int16).numpy().view(ml_dtypes.bfloat16))
    dump = load_dump(tmp_path)
    assert [r.dtype for r in dump] == ["bfloat16"] * 3
    for record in dump:
        assert_bitwise_equal(record.load(), t)


def test_a_single_file_is_a_dump(tmp_path: Path) -> None:
    save_file({"b": torch.ones(2), "a": torch.zeros(3)}, tmp_path / "one.safetensors")
    dump = load_dump(tmp_path / "one.safetensors")
    assert [r.key for r in dump] == ["one.a", "one.b"]


def test_npy_loads_memory_mapped_and_copy_on_write(tmp_path: Path) -> None:
    np.save(tmp_path / "x.npy", np.arange(4, dtype=np.float32))
    (record,) = load_dump(tmp_path)
    tensor = record.load()
    assert tensor is not None
    tensor += 1  # must not write through to the file
    assert np.load(tmp_path / "x.npy").tolist() == [0, 1, 2, 3]


DTYPES = [np.float16, np.float32, np.float64, np.int8, np.int32, np.int64, np.uint8, np.bool_]


@settings(max_examples=30, deadline=None)
@given(
    array=st.sampled_from(DTYPES).flatmap(
        lambda dtype: hnp.arrays(dtype, hnp.array_shapes(min_dims=0, max_dims=3, max_side=4))
    ),
    suffix=st.sampled_from([".npy", ".npz", ".pt", ".safetensors"]),
)
def test_every_format_round_trips_bitwise(
    tmp_path_factory: pytest.TempPathFactory, array: np.ndarray, suffix: str
) -> None:
    folder = tmp_path_factory.mktemp("plain")
    tensor = torch.from_numpy(array.copy())
    file = folder / f"t{suffix}"
    if suffix == ".npy":
        np.save(file, array)
    elif suffix == ".npz":
        np.savez(file, t=array)
    elif suffix == ".pt":
        torch.save(tensor, file)
    else:
        save_file({"t": tensor}, file)
    (record,) = load_dump(folder)
    assert record.shape == tuple(array.shape)
    assert_bitwise_equal(record.load(), tensor)


# ---- bad input ------------------------------------------------------------------------------


def test_pickle_payload_is_refused_and_never_runs(tmp_path: Path) -> None:
    marker = tmp_path / "payload-ran"
    folder = tmp_path / "dump"
    folder.mkdir()
    write_pickle_payload(folder / "evil.pt", marker)
    with pytest.raises(DumpFormatError, match="cannot be loaded safely") as info:
        load_dump(folder)
    assert info.value.path == str(folder / "evil.pt")
    assert not marker.exists()


@pytest.mark.parametrize("payload", ["random", "pickle"])
def test_a_refused_pt_never_advises_weights_only_false(tmp_path: Path, payload: str) -> None:
    """torch's own message suggests weights_only=False, which runs the file's pickle code:
    that advice is never passed on (#14)."""
    folder = tmp_path / "dump"
    folder.mkdir()
    if payload == "random":
        (folder / "x.pt").write_bytes(bytes(range(256)) * 3)
    else:
        write_pickle_payload(folder / "x.pt", tmp_path / "ran")
    with pytest.raises(DumpFormatError) as info:
        load_dump(folder)
    message = str(info.value)
    assert "weights_only" not in message
    assert "trust" not in message
    assert "safetensors" in message or "Re-save" in message


def test_npy_of_python_objects_is_refused(tmp_path: Path) -> None:
    np.save(tmp_path / "objects.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(DumpFormatError, match="Python objects"):
        load_dump(tmp_path)


@pytest.mark.parametrize("dtype", [">f4", "<U3", "V1"])
def test_npy_dtypes_without_a_torch_equivalent(tmp_path: Path, dtype: str) -> None:
    np.save(tmp_path / "x.npy", np.zeros(2, dtype=dtype))
    with pytest.raises(DumpFormatError, match="has no torch equivalent"):
        load_dump(tmp_path)


def test_truncated_npy(tmp_path: Path) -> None:
    file = tmp_path / "x.npy"
    np.save(file, np.zeros(100, dtype=np.float32))
    file.write_bytes(file.read_bytes()[:-4])
    with pytest.raises(DumpFormatError, match="truncated") as info:
        load_dump(tmp_path)
    assert info.value.path == str(file)


@pytest.mark.parametrize("keep", [4, 40, -4])
def test_truncated_safetensors(tmp_path: Path, keep: int) -> None:
    file = tmp_path / "x.safetensors"
    save_file({"x": torch.zeros(100)}, file)
    file.write_bytes(file.read_bytes()[:keep])
    with pytest.raises(DumpFormatError) as info:
        load_dump(tmp_path)
    assert info.value.path == str(file)


def test_truncated_npz(tmp_path: Path) -> None:
    file = tmp_path / "x.npz"
    np.savez(file, x=np.zeros(100))
    file.write_bytes(file.read_bytes()[:50])
    with pytest.raises(DumpFormatError, match=r"not a valid \.npz") as info:
        load_dump(tmp_path)
    assert info.value.path == str(file)


def test_truncated_pt(tmp_path: Path) -> None:
    file = tmp_path / "x.pt"
    torch.save(torch.zeros(100), file)
    file.write_bytes(file.read_bytes()[:200])
    with pytest.raises(DumpFormatError, match="cannot be loaded safely") as info:
        load_dump(tmp_path)
    assert info.value.path == str(file)


def test_legacy_pt_serialization_loads_without_mmap(tmp_path: Path) -> None:
    t = torch.arange(5, dtype=torch.bfloat16)
    torch.save(t, tmp_path / "old.pt", _use_new_zipfile_serialization=False)
    (record,) = load_dump(tmp_path)
    assert_bitwise_equal(record.load(), t)


def test_symlink_out_of_the_folder_is_refused(tmp_path: Path) -> None:
    outside = tmp_path / "outside.npy"
    np.save(outside, np.zeros(2))
    folder = tmp_path / "dump"
    folder.mkdir()
    (folder / "link.npy").symlink_to(outside)
    with pytest.raises(DumpFormatError, match="symlink points outside") as info:
        load_dump(folder)
    assert info.value.path == str(folder / "link.npy")
