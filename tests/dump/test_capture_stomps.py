"""A tensor overwritten behind torch's back after its record (a stomp) is recorded anew, with
the record it no longer equals, instead of reusing that record's data and statistics."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from dump_helpers import stomp

from pytest_precision import capture, tensor_stats
from pytest_precision._errors import DumpFormatError
from pytest_precision.dump._native import read_native_dump
from pytest_precision.dump._recorded import RecordedTensors
from pytest_precision.dump._records import RecordRef


class _StompsBetweenCalls(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        stomp(y)  # after mul returned, before neg reads it
        return y.neg()


@pytest.mark.parametrize("mode", ["tensor", "statistics"])
def test_the_consumer_records_the_stomped_values(tmp_path: Path, mode: str) -> None:
    x, model = torch.arange(8.0), _StompsBetweenCalls()
    with torch.no_grad(), capture(model, tmp_path, level="op", mode=mode):  # type: ignore[arg-type]
        model(x)
    records = {r.key: r for r in read_native_dump(tmp_path)}
    produced, consumed = (
        records["Tensor.mul.0.forward.output.0"],
        records["Tensor.neg.0.forward.input.0"],
    )
    stomped = x * 2
    stomped[:3] = 100.0
    assert produced.stats == tensor_stats(x * 2)
    assert produced.changed_since is None
    assert consumed.stats == tensor_stats(stomped)
    assert consumed.changed_since == RecordRef("Tensor.mul.0.forward", "output.0", 0)
    if mode == "tensor":
        assert torch.equal(consumed.load(), stomped)  # type: ignore[arg-type]
        assert consumed.data_id != produced.data_id


def test_a_clean_capture_marks_nothing_changed(tmp_path: Path) -> None:
    from hf_zoo import build, forward

    model = build("llama")
    with torch.no_grad(), capture(model, tmp_path, mode="statistics"):
        forward(model)
    records = list(read_native_dump(tmp_path))
    assert records
    assert not any(r.changed_since for r in records)


def test_a_stomped_tensor_is_not_reused_and_is_remembered_anew() -> None:
    forgotten: list[str] = []
    recorded = RecordedTensors(forgotten.append)
    t = torch.ones(4)
    recorded.remember(t, "0", "producer")
    assert recorded.key_of(t) == "0"
    assert recorded.changed_since is None
    stomp(t, count=1)
    assert recorded.key_of(t) is None
    assert recorded.changed_since == "producer"
    recorded.remember(t, "1", "consumer")
    assert recorded.key_of(t) == "1"
    assert recorded.changed_since is None
    assert forgotten == ["0"]


def test_a_malformed_changed_since_is_refused(tmp_path: Path) -> None:
    model = _StompsBetweenCalls()
    with torch.no_grad(), capture(model, tmp_path, level="op", mode="statistics"):
        model(torch.arange(8.0))
    index = tmp_path / "rank0" / "records.jsonl"
    lines = [json.loads(line) for line in index.read_text().splitlines()]
    changed = next(e for e in lines if "changed_since" in e)
    changed["changed_since"] = {"name": "x", "slot": 0, "step": 0}
    index.write_text("".join(json.dumps(e) + "\n" for e in lines))
    with pytest.raises(DumpFormatError, match="changed_since"):
        read_native_dump(tmp_path)


_LIBRARY = torch.library.Library("pp_stomp_test", "DEF")
_LIBRARY.define("fill(Tensor(a!) out, Tensor x) -> ()")


def _fill(out: torch.Tensor, x: torch.Tensor) -> None:
    stomp(out, value=float(x[0]), count=out.numel())  # a kernel writing its out argument


_LIBRARY.impl("fill", _fill, "CPU")


class _FillsItsOut(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = x * 0
        torch.ops.pp_stomp_test.fill(out, x + 7)  # bumps no version counter: a recorded write
        return out.neg()


def test_a_recorded_call_writing_its_out_argument_is_no_stomp(tmp_path: Path) -> None:
    x, model = torch.ones(4), _FillsItsOut()
    with torch.no_grad(), capture(model, tmp_path, level="op", mode="statistics"):
        model(x)
    records = {r.key: r for r in read_native_dump(tmp_path)}
    assert not any(r.changed_since for r in records.values())
    filled = tensor_stats(torch.full((4,), 8.0))
    assert records["Custom.pp_stomp_test.fill.0.forward.output.out"].stats == filled
    assert records["Tensor.neg.0.forward.input.0"].stats == filled


@pytest.mark.parametrize("where", ["head", "tail", "sampled word"])
def test_a_large_parameter_is_verified_where_overflows_land(where: str) -> None:
    """A weight is checked over its first and last 64 KiB and a sparse sample (a full sum
    would read it again for every record of it in a decode step): an overflow from a
    neighbouring buffer lands on its edges."""
    recorded = RecordedTensors(lambda key: None)
    weight = torch.nn.Parameter(torch.ones(256, 1024), requires_grad=False)
    recorded.remember(weight, "0", "parameters.weight")
    assert recorded.key_of(weight) == "0"
    flat = weight.detach().view(-1)
    offset = {"head": 0, "tail": flat.numel() - 3, "sampled word": 2 * 16384}[where]
    stomp(flat[offset:], count=3)
    assert recorded.key_of(weight) is None
    assert recorded.changed_since == "parameters.weight"
