"""``call_index``: a dump's calls from its metadata alone, as ``load_dump`` groups them, and
for native dumps without importing torch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from tp_dumps import write_tp_dump

from pytest_precision import DumpFormatError, capture, load_dump
from pytest_precision.dump._call_index import IndexedCall, call_index


def _expected(path: Path) -> list[IndexedCall]:
    return [
        IndexedCall(c.name, c.kind, c.step, c.rank, any(r.loader is not None for r in c.records))
        for c in load_dump(path).calls
    ]


class _Mlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(4, 8)
        self.down = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.nn.functional.silu(self.up(x)))


@pytest.mark.parametrize("mode", ["tensor", "statistics"])
def test_a_capture_indexes_as_the_reader_groups_it(tmp_path: Path, mode: str) -> None:
    torch.manual_seed(0)
    model = _Mlp()
    with torch.no_grad(), capture(model, tmp_path / "dump", level="mix", mode=mode):
        model(torch.randn(2, 4))
        model(torch.randn(2, 4))
    index = call_index(tmp_path / "dump")
    assert index.path == tmp_path / "dump"
    assert list(index.calls) == _expected(tmp_path / "dump")
    kinds = {c.kind for c in index.calls}
    assert {"Module", "Functional"} <= kinds
    assert any(c.has_tensors for c in index.calls) == (mode == "tensor")


def test_ranks_and_steps_keep_the_readers_order(tmp_path: Path) -> None:
    dump = write_tp_dump(tmp_path / "tp", ranks=3, steps=2, layers=2)
    calls = call_index(dump).calls
    assert list(calls) == _expected(dump)
    assert {(c.rank, c.step) for c in calls} == {(r, s) for r in range(3) for s in range(2)}


def test_other_layouts_go_through_the_full_reader(tmp_path: Path) -> None:
    np.save(tmp_path / "layer0.npy", np.arange(6, dtype=np.float32))
    index = call_index(tmp_path)
    assert list(index.calls) == _expected(tmp_path)
    assert len(index.calls) == 1
    assert index.calls[0].has_tensors


def test_a_native_dump_is_indexed_without_torch(tmp_path: Path) -> None:
    dump = write_tp_dump(tmp_path / "tp", ranks=2, steps=1, layers=1)
    script = (
        "import sys\n"
        "from pytest_precision.dump._call_index import call_index\n"
        f"print(len(call_index({str(dump)!r}).calls))\n"
        "print('torch' in sys.modules, 'numpy' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(len(_expected(dump))), "False", "False"]


def _records(dump: Path) -> Path:
    return dump / "rank0" / "records.jsonl"


def _damage_line(dump: Path, number: int, change: dict[str, object]) -> None:
    lines = _records(dump).read_text().splitlines(keepends=True)
    entry = json.loads(lines[number - 1])
    entry.update(change)
    lines[number - 1] = json.dumps(entry) + "\n"
    _records(dump).write_text("".join(lines))


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        (lambda d: _damage_line(d, 2, {"name": 3}), r"records\.jsonl:2: field 'name' missing"),
        (lambda d: _damage_line(d, 1, {"step": "0"}), r"records\.jsonl:1: field 'step' missing"),
        (
            lambda d: _records(d).write_text(_records(d).read_text().rsplit("\n", 2)[0] + "\n"),
            r"records\.jsonl: \d+ records, but rank\.json says \d+: truncated",
        ),
        (
            lambda d: _records(d).write_text(_records(d).read_text()[:-1]),
            r"records\.jsonl: line \d+: truncated record",
        ),
        (lambda d: (d / "rank0" / "rank.json").unlink(), "rank 0 never finalized"),
        (lambda d: next((d / "rank0").glob("shard-*")).write_bytes(b"x"), "truncated or altered"),
        (lambda d: (d / "manifest.json").write_text("{"), r"manifest\.json: malformed JSON"),
    ],
    ids=["name", "step", "count", "last-line", "rank-json", "shard", "manifest"],
)
def test_a_damaged_native_dump_is_refused_naming_the_file(
    tmp_path: Path, damage: object, problem: str
) -> None:
    dump = write_tp_dump(tmp_path / "tp", ranks=1, steps=1, layers=1)
    damage(dump)  # type: ignore[operator]
    with pytest.raises(DumpFormatError, match=problem):
        call_index(dump)
    with pytest.raises(DumpFormatError, match=problem):  # the full reader says the same
        load_dump(dump)


def test_a_missing_dump_is_refused(tmp_path: Path) -> None:
    with pytest.raises(DumpFormatError, match="no such file or directory"):
        call_index(tmp_path / "missing")
