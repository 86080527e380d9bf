"""The ATB (MindIE, msprobe atb_probe) reader, on trees made by ``tests/atb_helpers.py``."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from atb_helpers import bin_bytes, make_atb_dump
from dump_helpers import assert_bitwise_equal

from pytest_precision import DumpFormatError, compare_dumps, load_dump
from pytest_precision.cli import main

LAYERS = 3
#: records per round: embedding 2 x 3, per layer 4 + 3 ops x 2 x 3, LM head 3 x 3
PER_ROUND = 6 + LAYERS * (4 + 18) + 9
#: calls per round: embedding + kernel, per layer 1 + 3 ops + 3 kernels, head + op + kernel
CALLS_PER_ROUND = 2 + 7 * LAYERS + 3


@pytest.fixture(scope="module")
def golden(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_atb_dump(tmp_path_factory.mktemp("golden"))


def test_counts_names_and_nesting(golden: Path) -> None:
    dump = load_dump(golden)
    assert dump.format == "atb"
    assert len(dump) == 2 * PER_ROUND
    assert len(dump.calls) == 2 * CALLS_PER_ROUND
    assert {(r.rank, r.step) for r in dump} == {(0, 0), (0, 1)}
    layer2 = [c for c in dump.calls if c.step == 0 and (c.module or "").startswith("layers.2")]
    assert [(c.kind, c.module, c.op) for c in layer2] == [
        ("Module", "layers.2", "Decoder_layer"),
        ("Module", "layers.2.0_RmsNormOperation", "RmsNormOperation"),
        ("Kernel", "layers.2.0_RmsNormOperation.0_RmsNormKernel", "RmsNormKernel"),
        ("Module", "layers.2.1_LinearOperation", "LinearOperation"),
        ("Kernel", "layers.2.1_LinearOperation.0_MatMulKernel", "MatMulKernel"),
        ("Module", "layers.2.2_ElewiseOperation", "ElewiseOperation"),
        ("Kernel", "layers.2.2_ElewiseOperation.0_AddBF16Kernel", "AddBF16Kernel"),
    ]
    keys = [r.key for r in dump if r.step == 0 and r.module == "layers.2"]
    assert keys == [f"Module.layers.2.Decoder_layer.forward.0.{s}" for s in
                    ("input.0", "input.1", "input.2", "output.0")]  # fmt: skip
    # a layer's inputs come before the ops inside it, its outputs after them
    order = [r.key for r in dump if r.step == 0]
    first_op = "Kernel.layers.2.0_RmsNormOperation.0_RmsNormKernel.RmsNormKernel.forward.0.input.0"
    assert order.index(keys[0]) < order.index(first_op) < order.index(keys[-1])


def test_data_is_bitwise_and_follows_the_model(golden: Path) -> None:
    calls = {c.module: c for c in load_dump(golden).calls if c.step == 0}
    gather = calls["layers.0.0_GatherKernel"]
    ids, table = (r.load() for r in gather.inputs)
    assert ids is not None
    assert table is not None
    assert_bitwise_equal(gather.outputs[0].load(), table[ids])
    add = calls["layers.1.2_ElewiseOperation.0_AddBF16Kernel"]
    x, y = (r.load() for r in add.inputs)
    assert x is not None
    assert y is not None
    assert_bitwise_equal(add.outputs[0].load(), x + y)
    # the operation's weight is an alias (data=) of its kernel's file: the same bytes
    linear = calls["layers.1.1_LinearOperation"]
    kernel = calls["layers.1.1_LinearOperation.0_MatMulKernel"]
    assert linear.inputs[1].data_id == kernel.inputs[1].data_id
    assert_bitwise_equal(linear.inputs[1].load(), kernel.inputs[1].load())  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "tensor",
    [
        torch.tensor([1.0, -0.0, float("nan"), float("inf"), -3.5], dtype=torch.bfloat16),
        torch.tensor([[1.0, -0.0], [float("-inf"), 65504.0]], dtype=torch.float16),
        torch.arange(6, dtype=torch.int64).reshape(1, 2, 3) - 3,
        torch.tensor([True, False, True]),
        torch.zeros(0, 3),
        torch.tensor(2.5, dtype=torch.float64),
    ],
)
def test_every_dtype_reads_back_bitwise(tmp_path: Path, tensor: torch.Tensor) -> None:
    file = tmp_path / "0_1" / "0" / "0_Layer" / "after" / "outtensor0.bin"
    file.parent.mkdir(parents=True)
    file.write_bytes(bin_bytes(tensor))
    (record,) = load_dump(tmp_path)
    assert (record.dtype, record.shape, record.slot) == (
        str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape), "output.0",
    )  # fmt: skip
    assert_bitwise_equal(record.load(), tensor)


def _header(**changes: str | None) -> bytes:
    fields = {
        "$Version": "1.0", "$Object.Count": "1", "$Object.Length": "8", "format": "2",
        "dtype": "0", "dims": "2", "$Object.data": "0,8", "$End": "1",
    }  # fmt: skip
    for key, value in changes.items():
        key = key.replace("_", ".").replace("S", "$")
        if value is None:
            del fields[key]
        else:
            fields[key] = value
    end = fields.pop("$End", None)
    text = "".join(f"{k}={v}\n" for k, v in fields.items()) + ("" if end is None else "$End=1\n")
    return text.encode() + torch.ones(2).numpy().tobytes()


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (_header(SVersion="2.0"), r"\$Version='2.0'"),
        (_header(SObject_Count="2"), r"\$Object.Count must be 1"),
        (_header(SObject_Length="12"), r"\$Object.Length=12, dims \[2\] of float32 need 8"),
        (_header(dtype="13"), "unsupported dtype code 13"),
        (_header(dtype="x"), "dtype='x'"),
        (_header(dims="2,-1"), "dims='2,-1'"),
        (_header(dims=None), "no dims= line"),
        (_header(format=None), "no format= line"),
        (_header(SObject_data="4,8"), r"\$Object.data='4,8', expected 0,8"),
        (_header(SEnd=None), r"no '\$End=1' line"),
        (_header(extra="1"), r"unknown keys \['extra'\]"),
        (_header()[:-3], "bytes, the header promises"),
        (_header() + b"x", "bytes, the header promises"),
        (b"\xff\xfe=1\n$End=1\n", "line 1 is not ASCII"),
        (b"$Version=1.0\n$Version=1.0\n$End=1\n", "is not a new key=value"),
        (_header(data="../../../etc/passwd"), "points outside the round folder"),
        (_header(data="missing.bin"), "no such .bin file"),
    ],
)
def test_bad_headers_are_refused_in_one_line(tmp_path: Path, content: bytes, problem: str) -> None:
    file = tmp_path / "0_1" / "0" / "0_Layer" / "before" / "intensor0.bin"
    file.parent.mkdir(parents=True)
    file.write_bytes(content)
    with pytest.raises(DumpFormatError, match=problem) as info:
        load_dump(tmp_path)
    assert info.value.path == str(file)
    assert "\n" not in str(info.value)


def test_statistics_task_matches_the_tensors(golden: Path, tmp_path: Path) -> None:
    stats = load_dump(make_atb_dump(tmp_path, task="statistics"))
    tensors = {(r.step, r.key): r for r in load_dump(golden)}
    assert len(stats) == len(tensors) == 2 * PER_ROUND
    assert {(r.step, r.key) for r in stats} == set(tensors)
    for record in stats:
        same = tensors[record.step, record.key]
        t = same.load()
        assert t is not None
        assert record.stats is not None
        assert (record.dtype, record.shape, record.kind) == (same.dtype, same.shape, same.kind)
        assert record.stats.max == t.double().max().item()
        assert math.isclose(record.stats.norm, t.double().norm().item(), rel_tol=1e-12)
        assert record.load() is None


def test_statistics_csv_with_a_wrong_row_is_one_line(tmp_path: Path) -> None:
    root = make_atb_dump(tmp_path, task="statistics", rounds=1)
    csv_file = next(root.rglob("statistic.csv"))
    lines = csv_file.read_text().splitlines()
    csv_file.write_text("\n".join([*lines[:3], lines[3] + ",extra", *lines[4:]]) + "\n")
    with pytest.raises(DumpFormatError, match="row 4: 16 columns, expected 15"):
        load_dump(root)


@pytest.mark.parametrize(
    ("perturb", "module"),
    [
        ((2, 1), "layers.2.1_LinearOperation.0_MatMulKernel"),
        ((3, 2), "layers.3.2_ElewiseOperation.0_AddBF16Kernel"),
    ],
)
def test_a_perturbed_op_is_localized_to_its_layer_and_op(
    golden: Path, tmp_path: Path, perturb: tuple[int, int], module: str
) -> None:
    result = compare_dumps(make_atb_dump(tmp_path, perturb=perturb), golden)
    found = result.first_divergence
    assert found is not None
    assert (found.layer, found.module, found.step, found.cause) == (
        f"layers.{perturb[0]}", module, 0, "output",
    )  # fmt: skip


def test_a_clean_pair_has_no_culprit(golden: Path, tmp_path: Path) -> None:
    assert compare_dumps(make_atb_dump(tmp_path), golden).first_divergence is None


@pytest.mark.parametrize("level", ["atb_dump_data", "data", "data/0_4242", "data/0_4242/0"])
def test_loads_from_any_level_and_inspect_accepts_it(
    golden: Path, level: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = golden.parent / level if level == "atb_dump_data" else golden / level
    expected = PER_ROUND if level.endswith("/0") else 2 * PER_ROUND
    assert len(load_dump(path)) == expected
    assert main(["inspect", str(path)]) == 0
    assert "atb" in capsys.readouterr().out
