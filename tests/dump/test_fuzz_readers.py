"""Mutation fuzzing of every dump reader (see ``tests/fuzz_helpers.py``).

Each reader gets real dumps mutated one change at a time (truncation, flipped bytes, deleted
files, JSON nodes replaced by junk, 100,000-level nesting, header lines replaced, symlinks out of
the dump); every case must load or be refused in one line naming a file. The number of cases per
reader is ``PYTEST_PRECISION_FUZZ`` (60 by default; 1000 for a long run).
"""

from __future__ import annotations

import shutil
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from atb_helpers import make_atb_dump
from dump_helpers import MSPROBE_FIXTURES, REPO
from fuzz_helpers import ITERATIONS, check_load, fuzz_reader
from safetensors.torch import save_file

from pytest_precision import DumpFormatError, capture, load_dump


def _native(root: Path) -> Path:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.GELU(), torch.nn.Linear(4, 2))
    with capture(model, root / "native", level="mix"):
        model(torch.randn(2, 4))
    return root / "native"


def _plain(root: Path) -> Path:
    folder = root / "plain"
    (folder / "layers").mkdir(parents=True)
    np.save(folder / "layers" / "a.npy", np.arange(6, dtype=np.float32).reshape(2, 3))
    np.savez(folder / "b.npz", x=np.ones(3), y=np.zeros((2, 2), dtype=np.float16))
    torch.save({"h": [torch.ones(2), torch.zeros(1, dtype=torch.bfloat16)]}, folder / "c.pt")
    save_file({"w": torch.randn(3, 3)}, str(folder / "d.safetensors"))
    return folder


def _msprobe(root: Path) -> Path:
    shutil.copytree(MSPROBE_FIXTURES / "mix_tensor_steps", root / "msprobe")
    return root / "msprobe"


def _atb(root: Path) -> Path:
    return make_atb_dump(root, layers=1, rounds=1)


def _atb_statistics(root: Path) -> Path:
    return make_atb_dump(root, layers=1, rounds=2, task="statistics")


def _mindspore(root: Path) -> Path:
    shutil.copytree(REPO / "fixtures" / "mindspore" / "graph", root / "mindspore")
    return root / "mindspore"


SOURCES: dict[str, Callable[[Path], Path]] = {
    "mindspore": _mindspore,
    "native": _native,
    "plain": _plain,
    "msprobe": _msprobe,
    "atb": _atb,
    "atb-statistics": _atb_statistics,
}


@pytest.mark.parametrize("reader", list(SOURCES))
def test_mutated_dumps_load_or_are_refused_in_one_line(reader: str, tmp_path: Path) -> None:
    source = SOURCES[reader](tmp_path / "source")
    assert check_load(source)  # the unmutated dump loads
    outcome = fuzz_reader(source, tmp_path / "work", seed=zlib.crc32(reader.encode()))
    assert outcome.loaded + outcome.refused == ITERATIONS
    assert outcome.refused > 0


@pytest.mark.parametrize("depth", [1_000, 100_000])
def test_deeply_nested_dump_json_is_one_line_not_a_recursion_error(
    tmp_path: Path, depth: int
) -> None:
    root = _msprobe(tmp_path)
    dump_json = next(root.glob("step0/*/dump.json"))
    dump_json.write_text('{"data": {"Functional.x.0.forward": {"input_args": ' + "[" * depth
                         + "]" * depth + "}}}")  # fmt: skip
    with pytest.raises(DumpFormatError, match="nested too deeply") as info:
        load_dump(root)
    assert info.value.path == str(dump_json)


def test_nesting_below_the_json_limit_is_refused_by_the_walk(tmp_path: Path) -> None:
    root = _msprobe(tmp_path)
    dump_json = next(root.glob("step0/*/dump.json"))
    nested = "[" * 500 + "]" * 500
    dump_json.write_text('{"data": {"Functional.x.0.forward": {"input_args": ' + nested + "}}}")
    with pytest.raises(DumpFormatError, match=r"dump\.json: value input\.\.\.: nested too deeply"):
        load_dump(root)


def test_deeply_nested_native_record_and_pt_file(tmp_path: Path) -> None:
    root = _native(tmp_path)
    index = root / "rank0" / "records.jsonl"
    lines = index.read_text().splitlines(keepends=True)
    lines[0] = lines[0].replace('"value":null', '"value":' + "[" * 100_000 + "]" * 100_000, 1)
    index.write_text("".join(lines))
    with pytest.raises(DumpFormatError, match="line 1: nested too deeply"):
        load_dump(root)
    nested: list[object] = [torch.ones(1)]
    for _ in range(300):
        nested = [nested]
    torch.save(nested, tmp_path / "deep.pt")
    with pytest.raises(DumpFormatError, match=r"deep\.pt: nested too deeply"):
        load_dump(tmp_path / "deep.pt")
