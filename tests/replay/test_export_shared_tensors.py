"""Extracts of records that share tensors: one tensor passed twice to an op, an op fed by
another's output, views of one buffer. safetensors refuses to write tensors sharing memory, so
``export-test`` once failed on them with "Some tensors share memory"."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from dump_helpers import assert_bitwise_equal

from pytest_precision import capture, load_dump, replay_op
from pytest_precision.cli import main
from pytest_precision.dump._extract import write_calls
from pytest_precision.dump._records import Call, Record

#: every bfloat16 bit pattern's neighbourhood: NaN payloads, infinities, subnormals, signed zeros
BF16_BITS = torch.arange(-32768, 32768, 257, dtype=torch.int32).to(torch.int16)


class _Squares(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.mul(x, x)  # one tensor as both inputs
        return torch.sub(y, x)  # fed by mul's output, and by mul's input again


@pytest.fixture(scope="module")
def squares(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A bfloat16 capture whose calls share their tensors (see :class:`_Squares`)."""
    path = tmp_path_factory.mktemp("squares") / "dump"
    model = _Squares()
    with torch.no_grad(), capture(model, path, level="op"):
        model(BF16_BITS.view(torch.bfloat16))
    return path


def _assert_same_data(extract: Path, calls: list[Call]) -> None:
    """The extract holds the calls' records, data bitwise as recorded, records sharing a tensor
    in the source sharing it in the extract, each tensor stored once."""
    records = load_dump(extract).records
    originals = [r for call in calls for r in call.records]
    assert [(r.name, r.slot) for r in records] == [(r.name, r.slot) for r in originals]
    for record, original in zip(records, originals, strict=True):
        assert record.dtype == original.dtype
        tensor = original.load()
        if tensor is not None:
            assert_bitwise_equal(record.load(), tensor)

    def sharing(group: list[Record]) -> list[list[int]]:
        ids = [r.data_id for r in group]
        return [[i for i, other in enumerate(ids) if other == d] for d in ids]

    assert sharing(list(records)) == sharing(originals)
    stored = {r.data_id for r in records if r.data_id is not None}
    assert len(stored) == len({r.data_id for r in originals if r.data_id is not None})


def test_export_test_writes_an_op_given_one_tensor_twice(squares: Path, tmp_path: Path) -> None:
    call = next(c for c in load_dump(squares).calls if c.name == "Torch.mul.0.forward")
    assert call.records[0].data_id == call.records[1].data_id  # what made the export fail
    test_file = tmp_path / "test_mul.py"
    assert main(["export-test", str(squares), call.name, "-o", str(test_file)]) == 0
    mini = tmp_path / "test_mul_dump"
    _assert_same_data(mini, [call])
    assert replay_op(mini, call.name).verdict == "noise"


def test_an_extract_of_an_op_fed_by_another(squares: Path, tmp_path: Path) -> None:
    calls = load_dump(squares).calls
    assert calls[1].records[0].data_id == calls[0].outputs[0].data_id
    write_calls(calls, tmp_path / "extract", info={})
    _assert_same_data(tmp_path / "extract", calls)


def test_an_extract_of_views_of_one_buffer(tmp_path: Path) -> None:
    """Records without a data id (readers of other formats) whose tensors share memory: each
    view is written as its own tensor."""
    buffer = BF16_BITS.view(torch.bfloat16)
    views = {"input.0": buffer[:64], "input.1": buffer[64:], "output.0": buffer[:64]}
    records = tuple(
        Record(
            name="Torch.add.0.forward",
            slot=slot,
            kind="Torch",
            op="add",
            dtype="bfloat16",
            shape=tuple(view.shape),
            loader=lambda view=view: view,
        )
        for slot, view in views.items()
    )
    call = Call("Torch.add.0.forward", "Torch", "add", None, 0, 0, records)
    write_calls([call], tmp_path / "extract", info={})
    extracted = load_dump(tmp_path / "extract").records
    for record, view in zip(extracted, views.values(), strict=True):
        assert_bitwise_equal(record.load(), view)
