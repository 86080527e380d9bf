"""msprobe-MindSpore dumps (``Cell.*`` / ``Primitive.*`` / ``Mint.*`` names, ``.npy`` data), on a
real dump made by fixtures/mindspore/make_dumps.py (mindspore 2.10.0 and mindstudio-probe
26.2.0, PyNative on CPU, task tensor, level mix, steps 0 and 1 of TinyNet)."""

from __future__ import annotations

import numpy as np
import torch
from dump_helpers import REPO, assert_bitwise_equal

from pytest_precision import compare_dumps, compare_tensors, load_dump

MIX = REPO / "fixtures" / "mindspore" / "msprobe_mix"

#: one step's calls in msprobe's order (a Cell is logged when its construct returns):
#: (name, kind, op, module path, records)
CALLS = [
    ("Primitive.shape_op.Shape.0.forward", "Primitive", "shape_op.Shape", "block.fc1", 3),
    ("Primitive.matmul.MatMul.0.forward", "Primitive", "matmul.MatMul", "block.fc1", 3),
    ("Primitive.bias_add.BiasAdd.0.forward", "Primitive", "bias_add.BiasAdd", "block.fc1", 3),
    ("Cell.block.fc1.Dense.forward.0", "Module", "Dense", "block.fc1", 4),
    ("Functional.gelu.0.forward", "Functional", "gelu", "block.act", 3),
    ("Cell.block.act.GELU.forward.0", "Module", "GELU", "block.act", 2),
    ("Primitive.shape_op.Shape.1.forward", "Primitive", "shape_op.Shape", "block.fc2", 3),
    ("Primitive.matmul.MatMul.1.forward", "Primitive", "matmul.MatMul", "block.fc2", 3),
    ("Primitive.bias_add.BiasAdd.1.forward", "Primitive", "bias_add.BiasAdd", "block.fc2", 3),
    ("Cell.block.fc2.Dense.forward.0", "Module", "Dense", "block.fc2", 4),
    ("Tensor.__add__.0.forward", "Tensor", "__add__", "block", 3),
    ("Cell.block.Block.forward.0", "Module", "Block", "block", 2),
    ("Primitive.shape_op.Shape.2.forward", "Primitive", "shape_op.Shape", "head", 3),
    ("Primitive.matmul.MatMul.2.forward", "Primitive", "matmul.MatMul", "head", 3),
    ("Primitive.bias_add.BiasAdd.2.forward", "Primitive", "bias_add.BiasAdd", "head", 3),
    ("Cell.head.Dense.forward.0", "Module", "Dense", "head", 4),
    ("Mint.softmax.0.forward", "Mint", "softmax", None, 3),
]
PER_STEP = sum(n for *_, n in CALLS)  # 52 records, 44 of them tensors with a .npy file


def _calls(step: int) -> dict[str, object]:
    return {c.name: c for c in load_dump(MIX).calls if c.step == step}


def test_counts_names_kinds_and_module_paths() -> None:
    dump = load_dump(MIX)
    assert dump.format == "msprobe"
    assert dump.environment["framework"] == "mindspore"
    assert len(dump) == 2 * PER_STEP == 104
    assert sum(r.loader is not None for r in dump) == 88
    assert {(r.rank, r.step) for r in dump} == {(0, 0), (0, 1)}
    for step in (0, 1):
        calls = [c for c in dump.calls if c.step == step]
        got = [(c.name, c.kind, c.op, c.module, len(c.records)) for c in calls]
        assert got == CALLS
    cell = next(c for c in dump.calls if c.name == "Cell.block.fc1.Dense.forward.0")
    assert [r.slot for r in cell.records] == [
        "input.0", "output.0", "parameters.weight", "parameters.bias"
    ]  # fmt: skip


def test_data_is_bitwise_consistent_across_cells_and_their_ops() -> None:
    calls = _calls(0)

    def tensor(name: str, slot: str) -> torch.Tensor:
        record = next(r for r in calls[name].records if r.slot == slot)  # type: ignore[attr-defined]
        assert record.dtype == "float32"
        return record.load()

    x = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)
    fc1 = "Cell.block.fc1.Dense.forward.0"
    assert_bitwise_equal(tensor(fc1, "input.0"), torch.from_numpy(x))
    assert_bitwise_equal(
        tensor("Primitive.matmul.MatMul.0.forward", "input.0"), torch.from_numpy(x)
    )
    assert_bitwise_equal(
        tensor("Primitive.matmul.MatMul.0.forward", "input.1"), tensor(fc1, "parameters.weight")
    )
    assert_bitwise_equal(
        tensor("Primitive.bias_add.BiasAdd.0.forward", "input.0"),
        tensor("Primitive.matmul.MatMul.0.forward", "output.0"),
    )
    assert_bitwise_equal(
        tensor("Primitive.bias_add.BiasAdd.0.forward", "output.0"), tensor(fc1, "output.0")
    )
    assert_bitwise_equal(
        tensor("Tensor.__add__.0.forward", "output.0"),
        tensor("Cell.block.Block.forward.0", "output.0"),
    )
    assert_bitwise_equal(
        tensor("Mint.softmax.0.forward", "input.0"), tensor("Cell.head.Dense.forward.0", "output.0")
    )
    probs = tensor("Mint.softmax.0.forward", "output.0")
    assert probs.shape == (2, 2)
    assert torch.allclose(probs.double().sum(-1), torch.ones(2, dtype=torch.float64))
    # The Dense matmul is x @ W.T to float32 rounding (judged in float64).
    w = tensor(fc1, "parameters.weight").double()
    exact = torch.from_numpy(x).double() @ w.T
    got = tensor("Primitive.matmul.MatMul.0.forward", "output.0")
    assert compare_tensors(got, exact.float(), standard="ratio").verdict == "pass"


def test_statistics_match_the_data_and_steps_agree_bitwise() -> None:
    step0, step1 = _calls(0), _calls(1)
    for name, call in step0.items():
        for record, again in zip(call.records, step1[name].records, strict=True):  # type: ignore[attr-defined]
            if record.loader is None:
                continue
            data = record.load()
            assert_bitwise_equal(data, again.load())  # same input, same weights
            assert record.stats is not None
            assert record.stats.max == float(data.max())
            assert abs(record.stats.norm - float(data.double().norm())) <= 1e-6 * max(
                1.0, record.stats.norm
            )


def test_compares_against_itself_without_a_culprit() -> None:
    result = compare_dumps(MIX, MIX)
    assert result.first_divergence is None
