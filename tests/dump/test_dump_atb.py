"""The ATB (MindIE, msprobe atb_probe) reader, on trees made by ``tests/atb_helpers.py``."""

from __future__ import annotations

import math
import shutil
from collections.abc import Callable
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
#: how far statistic.csv's "%f" statistics may be from the float64 values
ROUNDING = 5e-7


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


def test_data_is_bitwise_and_aliases_follow_the_layer(golden: Path) -> None:
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
    # filter_level 1: a tensor an earlier operation of the layer saved is an alias of that file
    alias = golden / "data/0_4242/0/1_Decoder_layer/1_LinearOperation/before/intensor1.bin"
    assert b"\ndata=1_intensor2.bin\n" in alias.read_bytes()
    layer, linear = calls["layers.1"], calls["layers.1.1_LinearOperation"]
    assert linear.inputs[1].data_id == layer.inputs[2].data_id
    assert linear.inputs[0].data_id == calls["layers.1.0_RmsNormOperation"].outputs[0].data_id
    assert layer.outputs[0].data_id == calls["layers.1.2_ElewiseOperation"].outputs[0].data_id
    kernel = calls["layers.1.1_LinearOperation.0_MatMulKernel"]
    assert kernel.inputs[1].data_id != layer.inputs[2].data_id  # kernels are stored in full
    assert_bitwise_equal(linear.inputs[1].load(), kernel.inputs[1].load())  # type: ignore[arg-type]


def test_filter_level_2_leaves_the_kernels_data_out(tmp_path: Path) -> None:
    dump = load_dump(make_atb_dump(tmp_path, layers=1, rounds=1, filter_level=2))
    kernels = [r for r in dump if r.kind == "Kernel"]
    assert kernels
    assert all(r.loader is None and r.dtype == "float32" for r in kernels if r.op != "GatherKernel")
    assert all(r.load() is not None for r in dump if r.kind != "Kernel")


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


def _alias(target: str) -> bytes:
    return bin_bytes(torch.ones(2), alias=target)


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (_header(SVersion="2.0"), r"\$Version='2.0'"),
        (_header(SObject_Count="2"), r"\$Object.Count='2', expected '1' in a data file"),
        (_header(SObject_Length="12"), r"\$Object.Length='12', expected '8'"),
        (_header(dtype="13"), r"unsupported dtype code 13 \(string\)"),
        (_header(dtype="x"), "dtype='x'"),
        (_header(dims="2,-1"), "dims='2,-1'"),
        (_header(dims=None), "no dims= line"),
        (_header(format=None), "no format= line"),
        (_header(SObject_data="4,8"), r"\$Object.data='4,8', expected '0,8'"),
        (_header(SEnd=None), r"no '\$End=1' line"),
        (_header(extra="1"), r"unknown keys \['extra'\]"),
        (_header()[:-3], "bytes, the header promises"),
        (_header() + b"x", "bytes, the header promises"),
        (b"\xff\xfe=1\n$End=1\n", "line 1 is not ASCII"),
        (b"$Version=1.0\n$Version=1.0\n$End=1\n", "is not a new key=value"),
        (_header(data="0_intensor1.bin"), r"\$Object.Count='1', expected '0' in an alias"),
        (_alias("0_intensor1.bin") + b"12345678", "an alias holds no data, but 8 bytes follow"),
        (_alias("../../../etc/passwd"), r"is not <op ids>_<intensor\|outtensor><N>.bin"),
        (_alias("0_intensor1.bin"), "no such tensor in the round folder"),
        (_alias("0_intensor0.bin"), "alias of an alias"),  # itself
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


@pytest.mark.parametrize("task", ["statistics", "all"])
def test_statistics_match_the_tensors(golden: Path, tmp_path: Path, task: str) -> None:
    stats = load_dump(make_atb_dump(tmp_path, task=task))
    tensors = {(r.step, r.key): r for r in load_dump(golden)}
    assert [(r.step, r.key) for r in stats] == list(tensors)
    for record in stats:
        same = tensors[record.step, record.key]
        t = same.load()
        assert t is not None
        assert record.stats is not None
        assert (record.dtype, record.shape, record.kind) == (same.dtype, same.shape, same.kind)
        assert record.stats.max == pytest.approx(t.double().max().item(), abs=ROUNDING)
        assert record.stats.norm == pytest.approx(t.double().norm().item(), abs=ROUNDING)
        assert record.stats.nan_count == 0
        assert (record.load() is None) == (task == "statistics")


def _rows(root: Path) -> tuple[Path, list[str]]:
    csv_file = next(root.rglob("statistic.csv"))
    return csv_file, csv_file.read_text().splitlines()


@pytest.mark.parametrize("task", ["statistics", "all"])
def test_rows_in_any_order_in_a_moved_dump(tmp_path: Path, task: str) -> None:
    """atb_probe's writer threads append rows in the order they finish, and its tensor paths
    name the folder the dump was written to."""
    written = make_atb_dump(tmp_path / "written", layers=1, task=task)
    expected = [r.key for r in load_dump(written)]
    moved = tmp_path / "moved" / "atb_dump_data"
    shutil.move(written.parent, moved.parent)
    for csv_file in moved.rglob("statistic.csv"):
        header, *rows = csv_file.read_text().splitlines()
        assert (str(written) in rows[0]) == (task == "all")
        shuffled = [header, *rows[::-2], header, *rows[-2::-2]]  # and a second header (a race)
        csv_file.write_text("\n".join(shuffled) + "\n")
    dump = load_dump(moved)
    assert [r.key for r in dump] == expected
    assert all((r.load() is not None) == (task == "all") and r.stats is not None for r in dump)


def test_a_file_without_a_row_is_read_and_a_row_without_its_file_is_refused(
    tmp_path: Path,
) -> None:
    root = make_atb_dump(tmp_path, layers=1, rounds=1, task="all")
    csv_file, lines = _rows(root)
    dropped = lines.pop(5)  # atb_probe drops rows whose values start with "-" (-inf, -nan)
    csv_file.write_text("\n".join(lines) + "\n")
    dump = load_dump(root)
    assert sum(r.stats is None for r in dump) == 1
    assert all(r.load() is not None for r in dump)
    bin_file = Path(dropped.rsplit(",", 1)[1])
    assert bin_file.is_file()
    (next(root.rglob("1_Decoder_layer/before/intensor0.bin"))).unlink()
    with pytest.raises(DumpFormatError, match=r"row \d+: its Tensor Path is not in the round"):
        load_dump(root)


_COLUMNS = {"device": 0, "count": 1, "name": 2, "type": 3, "ids": 4, "io": 5, "dtype": 7,
            "format": 8, "shape": 9, "max": 10, "path": 14}  # fmt: skip
Mutation = Callable[[list[str]], list[list[str]]]


def _set(**cells: str) -> Mutation:
    """Replace some cells of the row."""

    def mutate(row: list[str]) -> list[list[str]]:
        changed = list(row)
        for column, value in cells.items():
            changed[_COLUMNS[column]] = value
        return [changed]

    return mutate


#: row 3 of a one-layer dump: the embedding's input 1, 0_4242,0,WordEmbedding,WordEmbedding,0,
#: input,1,float,nd,16x8,<max>,<min>,<mean>,<norm>,<path of 0_WordEmbedding/before/intensor1.bin>
BAD_ROWS: list[tuple[str, Mutation, str]] = [
    ("all", lambda row: [[*row, "x"]], "row 3: 16 columns, expected 15"),
    ("all", lambda row: [row, row], "row 4 repeats row 3"),
    ("all", _set(device="1_4242"), "row 3: Device and PID '1_4242', expected 0_4242"),
    ("all", _set(count="5"), "row 3: Execution Count '5', but the round folder is 0"),
    ("all", _set(type="Other"), "row 3: Op Type 'Other' is not the last name of Op Name"),
    ("all", _set(ids="0_0"), "row 3: Op Id '0_0' is not one <id> per name"),
    ("all", _set(io="intensor"), "row 3: Input/Output 'intensor' and Index '1'"),
    ("all", _set(dtype="FLOAT16"), "row 3: Dtype 'FLOAT16' is not one atb_probe writes"),
    ("all", _set(format="ND"), "row 3: Format 'ND' is not one atb_probe writes"),
    ("all", _set(shape="16*8"), r"row 3: Shape '16\*8' is not <d0>x<d1>x"),
    ("all", _set(max="N/A"), "row 3: Max/Min/Mean/Norm 'N/A,"),
    ("all", _set(path="/tmp/x.bin"), "row 3: Tensor Path '/tmp/x.bin' is neither N/A nor in an"),
    (
        "all",
        _set(path="/a/atb_dump_data/data/0_4242/0/../../../../etc/passwd"),
        r"row 3: Tensor Path ends in 'data/0_4242/0/\.\./\.\./\.\./\.\./etc/passwd', expected "
        r"data/0_4242/0/0_WordEmbedding/before/intensor1\.bin",
    ),
    (
        "statistics",
        _set(name="Embedding", type="Embedding"),
        "row 3: op 0 is named 'Embedding' here, but 'WordEmbedding' in row 2",
    ),
    ("all", _set(dtype="int32"), "disagree with statistic.csv row 3"),
]


@pytest.mark.parametrize(("task", "mutate", "problem"), BAD_ROWS)
def test_a_bad_statistics_row_is_refused_in_one_line(
    tmp_path: Path, task: str, mutate: Callable[[list[str]], list[list[str]]], problem: str
) -> None:
    root = make_atb_dump(tmp_path, layers=1, rounds=1, task=task)
    csv_file, lines = _rows(root)
    assert lines[2].split(",")[2:10] == ["WordEmbedding", "WordEmbedding", "0", "input", "1",
                                          "float", "nd", "16x8"]  # fmt: skip
    lines[2:3] = [",".join(row) for row in mutate(lines[2].split(","))]
    csv_file.write_text("\n".join(lines) + "\n")
    with pytest.raises(DumpFormatError, match=problem) as info:
        load_dump(root)
    assert "\n" not in str(info.value)
    if "disagree" not in problem:
        assert info.value.path == str(csv_file)


def test_nan_and_inf_statistics(tmp_path: Path) -> None:
    """atb_probe's max / min skip NaN and its norm does not: a NaN norm means a NaN element."""
    root = make_atb_dump(tmp_path, layers=1, rounds=1, task="statistics")
    csv_file, lines = _rows(root)
    cells = lines[2].split(",")
    cells[10:14] = ["inf", "-inf", "nan", "nan"]
    lines[2] = ",".join(cells)
    csv_file.write_text("\n".join(lines) + "\n")
    stats = [r.stats for r in load_dump(root)][1]  # the embedding's input 1
    assert stats is not None
    assert (stats.nan_count, stats.posinf_count, stats.neginf_count) == (1, 1, 1)
    assert math.isnan(stats.mean)


@pytest.mark.parametrize(
    ("task", "perturb", "module"),
    [
        ("tensor", (2, 1), "layers.2.1_LinearOperation.0_MatMulKernel"),
        ("tensor", (3, 2), "layers.3.2_ElewiseOperation.0_AddBF16Kernel"),
        ("statistics", (2, 1), "layers.2.1_LinearOperation.0_MatMulKernel"),
    ],
)
def test_a_perturbed_op_is_localized_to_its_layer_and_op(
    golden: Path, tmp_path: Path, task: str, perturb: tuple[int, int], module: str
) -> None:
    reference = golden if task == "tensor" else make_atb_dump(tmp_path / "golden", task=task)
    result = compare_dumps(
        make_atb_dump(tmp_path / "target", task=task, perturb=perturb), reference
    )
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
