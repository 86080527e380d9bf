"""The native dump format: exact round trips of every dtype, JSON values, and bad input."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from pytest_precision import DumpFormatError, tensor_stats
from pytest_precision.dump._native import decode_value, encode_value, read_native_dump
from pytest_precision.dump._native_index import is_native_dump
from pytest_precision.dump._writer import DumpWriter, summarize


def _entry(name: str, slot: str, t: torch.Tensor | None = None, step: int = 0) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "name": name,
        "slot": slot,
        "kind": "Torch",
        "op": "op",
        "module": "",
        "parent": None,
        "step": step,
        "dtype": None if t is None else str(t.dtype).removeprefix("torch."),
        "shape": None if t is None else list(t.shape),
        "value": None,
    }
    return entry


def write_dump(
    root: Path, tensors: dict[str, torch.Tensor], *, shard_bytes: int = 1 << 20, **kwargs: Any
) -> None:
    writer = DumpWriter(
        root, rank=0, world_size=1, info={"level": "op", "mode": "tensor"}, shard_bytes=shard_bytes,
        **kwargs,
    )  # fmt: skip
    writer.start()
    for key, (name, t) in enumerate(tensors.items()):
        writer.add(_entry(name, "output.0", t), key=str(key), tensor=t.clone())
    writer.close()


def _every_dtype() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    base = torch.randn(3, 5, generator=g) * 100
    tensors = {
        str(dtype): base.to(dtype)
        for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16)
    }
    tensors.update({str(d): base.to(torch.int64).to(d) for d in (torch.int8, torch.int16)})
    tensors.update({str(d): base.to(torch.int64).to(d) for d in (torch.int32, torch.int64)})
    tensors["uint8"] = base.abs().to(torch.uint8)
    tensors["bool"] = base > 0
    tensors["complex64"] = torch.complex(base, -base)
    tensors["complex128"] = torch.complex(base, base).to(torch.complex128)  # stored as bytes
    tensors["float8_e4m3fn"] = base.to(torch.float8_e4m3fn)
    tensors["float4_e2m1fn_x2"] = base.to(torch.uint8).view(torch.float4_e2m1fn_x2)  # no stats
    tensors["uint16"] = base.abs().to(torch.int32).to(torch.uint16)
    tensors["scalar"] = torch.tensor(1.5, dtype=torch.bfloat16)
    tensors["empty"] = torch.zeros(0, 4, dtype=torch.bfloat16)
    tensors["specials"] = torch.tensor([math.nan, math.inf, -math.inf, -0.0, 1e-40])
    return tensors


def test_every_dtype_round_trips_bitwise(tmp_path: Path) -> None:
    tensors = _every_dtype()
    write_dump(tmp_path, tensors)
    dump = read_native_dump(tmp_path)
    assert [r.name for r in dump] == list(tensors)
    float4 = next(r for r in dump if r.name == "float4_e2m1fn_x2")
    assert float4.stats is None  # torch cannot reduce it; its data is still stored exactly
    for record, expected in zip(dump, tensors.values(), strict=True):
        loaded = record.load()
        assert loaded is not None
        assert loaded.dtype == expected.dtype, record.name
        assert loaded.shape == expected.shape, record.name
        # Compare the bytes: equal() would call nan != nan and -0.0 == 0.0.
        assert bytes(loaded.reshape(-1).view(torch.uint8)) == bytes(
            expected.reshape(-1).view(torch.uint8)
        ), record.name
        assert record.dtype == str(expected.dtype).removeprefix("torch.")
        assert record.shape == tuple(expected.shape)
        assert repr(record.stats) == repr(summarize(expected)[0]), record.name  # nan-aware


def test_shards_roll_over_and_pending_memory_stays_bounded(tmp_path: Path) -> None:
    tensors = {f"t{i}": torch.full((256, 256), float(i)) for i in range(12)}  # 256 KiB each
    write_dump(tmp_path, tensors, shard_bytes=512 << 10, pending_bytes=600 << 10)
    assert len(list((tmp_path / "rank0").glob("shard-*.safetensors"))) == 6
    dump = read_native_dump(tmp_path)
    for record, expected in zip(dump, tensors.values(), strict=True):
        assert torch.equal(record.load(), expected)


def test_alias_shares_data_and_statistics_mode_stores_none(tmp_path: Path) -> None:
    writer = DumpWriter(tmp_path, rank=0, world_size=1, info={})
    writer.start()
    t = torch.arange(6.0)
    writer.add(_entry("A", "output.0", t), key="0", tensor=t.clone())
    writer.add(_entry("B", "input.0", t), alias="0")
    writer.add(_entry("C", "output.0", t, step=2), key="1", stats=tensor_stats(t))
    writer.add(_entry("C", "kwargs.dim") | {"value": encode_value(-math.inf)})
    writer.close()
    a, b, c, value = read_native_dump(tmp_path)
    assert torch.equal(b.load(), t)
    assert b.stats == a.stats == c.stats == tensor_stats(t)
    assert c.load() is None
    assert c.step == 2
    assert value.value == -math.inf
    assert value.dtype is None
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["steps"] == [0, 2]
    assert manifest["complete"] is True


json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False),
    st.text(),
    st.sampled_from([math.inf, -math.inf, Ellipsis, slice(1, None, 2), 1 + 2j]),
)
json_values = st.recursive(
    json_leaf,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8,
)


@given(json_values)
def test_values_survive_strict_json(value: Any) -> None:
    text = json.dumps(encode_value(value), allow_nan=False)
    assert decode_value(json.loads(text)) == value


def test_nan_and_torch_values_are_encoded_safely() -> None:
    assert math.isnan(decode_value(json.loads(json.dumps(encode_value(math.nan)))))
    assert encode_value(torch.bfloat16) == "torch.bfloat16"
    assert encode_value(torch.Size([2, 3])) == [2, 3]
    assert encode_value((1, (2, None))) == [1, [2, None]]
    assert encode_value(object.__new__(object)).keys() == {"$repr"}


def test_is_native_dump(tmp_path: Path) -> None:
    assert not is_native_dump(tmp_path)
    write_dump(tmp_path, {"x": torch.ones(2)})
    assert is_native_dump(tmp_path)


# -- bad input: every problem is named, with its file -------------------------------------------


@pytest.fixture
def dump(tmp_path: Path) -> Path:
    write_dump(tmp_path, {"a": torch.ones(4, 4), "b": torch.zeros(3, dtype=torch.bfloat16)})
    return tmp_path


def _edit_json(path: Path, **changes: Any) -> None:
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


def _edit_first_record(dump: Path, **changes: Any) -> None:
    index = dump / "rank0" / "records.jsonl"
    lines = index.read_text().splitlines(keepends=True)
    first = json.loads(lines[0])
    first.update(changes)
    lines[0] = json.dumps(first) + "\n"
    index.write_text("".join(lines))


def _shard(dump: Path) -> Path:
    return next((dump / "rank0").glob("shard-*.safetensors"))


def _truncate_shard(dump: Path) -> None:
    shard = _shard(dump)
    shard.write_bytes(shard.read_bytes()[:-10])


def _truncate_shard_and_its_size(dump: Path) -> None:
    shard = _shard(dump)
    shard.write_bytes(shard.read_bytes()[:-10])
    _edit_json(dump / "rank0" / "rank.json", shards={shard.name: shard.stat().st_size})


@pytest.mark.parametrize(
    ("damage", "file", "problem"),
    [
        (lambda d: (d / "manifest.json").write_text("{nope"), "manifest.json", "malformed JSON"),
        (
            lambda d: _edit_json(d / "manifest.json", schema_version=99),
            "manifest.json",
            "unknown schema version 99",
        ),
        (
            lambda d: _edit_json(d / "manifest.json", complete=False),
            "manifest.json",
            "incomplete dump",
        ),
        (lambda d: (d / "manifest.json").unlink(), "manifest.json", "incomplete dump"),
        (lambda d: (d / "rank0" / "rank.json").unlink(), "rank.json", "never finalized"),
        (lambda d: _shard(d).unlink(), "shard-00000.safetensors", "missing shard"),
        (_truncate_shard, "shard-00000.safetensors", "truncated"),
        (_truncate_shard_and_its_size, "shard-00000.safetensors", "unreadable safetensors"),
        (
            lambda d: _edit_first_record(d, data={"shard": "../../secret.safetensors", "key": "0"}),
            "records.jsonl:1",
            "points outside the dump folder",
        ),
        (
            lambda d: _edit_json(d / "rank0" / "rank.json", shards={"/etc/passwd": 10}),
            "rank.json",
            "points outside the dump folder",
        ),
        (
            lambda d: _edit_first_record(d, data={"shard": "shard-00000.safetensors", "key": "9"}),
            "shard-00000.safetensors",
            "has no tensor '9'",
        ),
        (lambda d: _edit_first_record(d, shape=[5, 5]), "shard-00000.safetensors", "shape"),
        (lambda d: _edit_first_record(d, name=None), "records.jsonl:1", "field 'name'"),
        (
            lambda d: (d / "rank0" / "records.jsonl").write_text("{\n"),
            "records.jsonl",
            "line 1: malformed JSON",
        ),
        (
            lambda d: (d / "rank0" / "records.jsonl").write_text('{"name": "a"}'),
            "records.jsonl",
            "line 1: truncated record",
        ),
        (
            lambda d: _edit_json(d / "rank0" / "rank.json", records=3),
            "records.jsonl",
            "truncated",
        ),
        (lambda d: _edit_first_record(d, stats={"$bogus": 1}), "records.jsonl:1", "statistics"),
        (lambda d: _edit_first_record(d, shape=[-1, -16]), "records.jsonl:1", "malformed shape"),
        (lambda d: _edit_first_record(d, shape=5), "records.jsonl:1", "malformed shape"),
        (lambda d: _edit_first_record(d, stride=[1]), "records.jsonl:1", "malformed stride"),
        (
            lambda d: _edit_first_record(d, padding={"real": [[1, 2]], "query": 2}),
            "records.jsonl:1",
            "malformed padding",
        ),
        (
            lambda d: _edit_first_record(d, padding={"real": [[1, 0]], "query": 3}),
            "records.jsonl:1",
            "malformed padding",
        ),
        (
            lambda d: (d / "rank0" / "records.jsonl").write_bytes(b"\xff\n"),
            "records.jsonl",
            "not UTF-8",
        ),
    ],
)
def test_bad_dumps_are_refused_with_file_and_problem(
    dump: Path, damage: Any, file: str, problem: str
) -> None:
    damage(dump)
    with pytest.raises(DumpFormatError, match=problem) as info:
        read_native_dump(dump)
    assert file in info.value.path or file in str(info.value)
    assert problem in info.value.problem


def test_a_shard_linking_outside_the_dump_is_refused(dump: Path, tmp_path_factory: Any) -> None:
    shard = _shard(dump)
    outside = tmp_path_factory.mktemp("elsewhere") / "secret.safetensors"
    outside.write_bytes(shard.read_bytes())
    shard.unlink()
    shard.symlink_to(outside)
    with pytest.raises(DumpFormatError, match="outside the dump folder"):
        read_native_dump(dump)


def test_writer_refuses_a_folder_holding_a_dump(dump: Path) -> None:
    from pytest_precision import PrecisionError

    with pytest.raises(PrecisionError, match="already holds a dump"):
        DumpWriter(dump, rank=0, world_size=1, info={}).start()


def test_a_failing_writer_thread_is_reported_not_hung(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pytest_precision import PrecisionError
    from pytest_precision.dump import _writer

    def disk_full(path: Path, tensors: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(_writer, "write_safetensors", disk_full)
    writer = DumpWriter(
        tmp_path, rank=0, world_size=1, info={}, shard_bytes=1024, pending_bytes=2048
    )
    writer.start()

    def fill() -> None:
        for key in range(100):  # blocks on the memory budget until the thread's error surfaces
            writer.add(_entry("x", f"output.{key}"), key=str(key), tensor=torch.zeros(256))
        writer.close()

    with pytest.raises(PrecisionError, match=r"writing the dump failed: .*No space left"):
        fill()
    with pytest.raises(DumpFormatError, match="incomplete"):
        read_native_dump(tmp_path)


def test_memory_held_by_the_writer_stays_within_its_budget(tmp_path: Path) -> None:
    class Watched(DumpWriter):
        peak = 0

        def add(self, entry: dict[str, Any], **kwargs: Any) -> None:
            super().add(entry, **kwargs)
            Watched.peak = max(Watched.peak, self._pending)

    writer = Watched(
        tmp_path, rank=0, world_size=1, info={}, shard_bytes=256 << 10, pending_bytes=600 << 10
    )
    writer.start()
    for key in range(40):  # 10 MiB through a 600 KiB budget
        t = torch.full((64 << 10,), float(key))  # 256 KiB
        writer.add(_entry("x", f"output.{key}", t), key=str(key), tensor=t)
    writer.close()
    assert 0 < Watched.peak <= 600 << 10
    dump = read_native_dump(tmp_path)
    assert [float(r.load()[0]) for r in dump] == [float(k) for k in range(40)]
