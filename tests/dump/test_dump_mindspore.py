"""The MindSpore graph-mode dump reader, on real dumps made by fixtures/mindspore/make_dumps.py
(mindspore 2.10.0, CPU, graph mode, iterations 0 and 1 of TinyNet)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from dump_helpers import REPO, assert_bitwise_equal

from pytest_precision import DumpFormatError, load_dump
from pytest_precision.cli import main

GRAPH = REPO / "fixtures" / "mindspore" / "graph"
PARAMETERS = ["head_bias", "block_fc2_bias", "block_fc1_bias", "block_fc1_weight",
              "block_fc2_weight", "head_weight", "x"]  # fmt: skip
KERNELS = [
    ("Default/block-Block/fc1-Dense/MatMul-op0", "block.fc1", 5),
    ("Default/block-Block/fc1-Dense/BiasAdd-op0", "block.fc1", 4),
    ("Default/block-Block/act-GELU/GeLU-op0", "block.act", 2),
    ("Default/block-Block/fc2-Dense/MatMul-op0", "block.fc2", 5),
    ("Default/block-Block/fc2-Dense/BiasAdd-op0", "block.fc2", 4),
    ("Default/block-Block/Add-op0", "block", 3),
    ("Default/head-Dense/MatMul-op0", "head", 5),
    ("Default/head-Dense/BiasAdd-op0", "head", 4),
    ("Default/Softmax-op0", "", 3),
]
PER_ITERATION = len(PARAMETERS) + sum(n for _, _, n in KERNELS)


def test_counts_names_order_and_scopes() -> None:
    dump = load_dump(GRAPH)
    assert dump.format == "mindspore"
    assert len(dump) == 2 * PER_ITERATION == 84
    assert {(r.rank, r.step) for r in dump} == {(0, 0), (0, 1)}
    calls = [c for c in dump.calls if c.step == 1]
    assert [c.name for c in calls[: len(PARAMETERS)]] == [f"Parameter.{p}" for p in PARAMETERS]
    kernels = [(c.name, c.module, len(c.records)) for c in calls[len(PARAMETERS) :]]
    assert kernels == KERNELS  # execution order, from execution_order/
    assert {c.op for c in calls} >= {"MatMul", "BiasAdd", "GeLU", "Add", "Softmax", "Parameter"}


def test_scopes_recovered_from_file_names_alone(tmp_path: Path) -> None:
    shutil.copytree(GRAPH, tmp_path / "graph")
    shutil.rmtree(tmp_path / "graph" / "rank_0" / "execution_order")
    calls = [c for c in load_dump(tmp_path / "graph").calls if c.kind == "Primitive"]
    assert sorted((c.name, c.module) for c in calls if c.step == 0) == sorted(
        (name, module) for name, module, _ in KERNELS
    )


def test_data_is_bitwise_what_the_net_computed() -> None:
    calls = {c.name: c for c in load_dump(GRAPH).calls if c.step == 0}
    x = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)
    assert_bitwise_equal(calls["Parameter.x"].records[0].load(), torch.from_numpy(x))
    fc1 = calls["Default/block-Block/fc1-Dense/MatMul-op0"]
    assert_bitwise_equal(fc1.inputs[0].load(), torch.from_numpy(x))
    weight = calls["Parameter.block_fc1_weight"].records[0].load()
    assert weight is not None
    assert_bitwise_equal(fc1.inputs[1].load(), weight)
    add = calls["Default/block-Block/Add-op0"]
    a, b = (r.load() for r in add.inputs)
    assert a is not None
    assert b is not None
    assert_bitwise_equal(add.outputs[0].load(), a + b)
    assert fc1.inputs[2].dtype == "bool"  # MatMul's transpose flags are dumped as tensors
    soft = calls["Default/Softmax-op0"].outputs[0].load()
    assert soft is not None
    assert torch.allclose(soft.sum(-1), torch.ones(2))


@pytest.mark.parametrize("level", ["", "rank_0"])
def test_loads_from_the_root_or_a_rank_and_inspect_accepts_it(
    level: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert len(load_dump(GRAPH / level)) == 84
    assert main(["inspect", str(GRAPH / level)]) == 0
    assert "mindspore" in capsys.readouterr().out


def _first_npy(root: Path) -> Path:
    return next((root / "rank_0" / "TinyNet" / "0" / "0").glob("Add.*.output.0.*.npy"))


@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        (lambda f: f.rename(f.with_name(f.name.replace("Float32", "Float99"))), "unknown dtype"),
        (lambda f: f.rename(f.with_name(f.name.replace("Float32", "Int32"))), "holds float32"),
        (lambda f: f.rename(f.with_name("Add.x.npy")), "not a MindSpore dump file name"),
        (lambda f: f.write_bytes(f.read_bytes()[:-4]), "truncated"),
    ],
)
def test_bad_files_are_refused_in_one_line(tmp_path: Path, edit: object, problem: str) -> None:
    root = tmp_path / "graph"
    shutil.copytree(GRAPH, root)
    edit(_first_npy(root))  # type: ignore[operator]
    with pytest.raises(DumpFormatError, match=problem) as info:
        load_dump(root)
    assert "\n" not in str(info.value)


def test_bad_execution_order_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "graph"
    shutil.copytree(GRAPH, root)
    order = root / "rank_0" / "execution_order" / "ms_execution_order_graph_0.csv"
    order.write_text("Something else\n")
    with pytest.raises(DumpFormatError, match="NodeExecutionOrder-FullNameWithScope"):
        load_dump(root)
