"""The msprobe reader, on real dumps made by mindstudio-probe (fixtures/msprobe/make_dumps.py)."""

from __future__ import annotations

import importlib.util
import json
import math
import zlib
from collections.abc import Callable, Iterable
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import torch
from dump_helpers import MSPROBE_FIXTURES, assert_bitwise_equal, write_pickle_payload
from safetensors.torch import load_file

from pytest_precision import DumpFormatError, Record, load_dump

#: case -> (records, tensors with data files, steps, ranks)
CASES = {
    "l0_tensor": (30, 30, {0}, {0}),
    "l1_tensor_ranks": (48, 44, {0}, {0, 1}),
    "mix_tensor_steps": (80, 76, {0, 1}, {0}),
    "mix_statistics": (40, 0, {0}, {0}),
    "l1_md5": (24, 0, {0}, {0}),
}
TENSOR_CASES = [case for case, (_, files, _, _) in CASES.items() if files]

#: calls of one step, in msprobe's order (a module is logged when its forward returns)
MIX_CALLS = [
    "Functional.linear.0.forward",
    "Module.block.fc1.Linear.forward.0",
    "Functional.gelu.0.forward",
    "Module.block.act.GELU.forward.0",
    "Functional.linear.1.forward",
    "Module.block.fc2.Linear.forward.0",
    "Module.block.Block.forward.0",
    "Torch.matmul.0.forward",
    "Functional.softmax.0.forward",
    "Tensor.__matmul__.0.forward",
    "Functional.linear.2.forward",
    "Module.head.Linear.forward.0",
]
MIX_PARENTS = {
    "Functional.linear.0.forward": "Module.block.fc1.Linear.forward.0",
    "Module.block.fc1.Linear.forward.0": "Module.block.Block.forward.0",
    "Functional.gelu.0.forward": "Module.block.act.GELU.forward.0",
    "Module.block.act.GELU.forward.0": "Module.block.Block.forward.0",
    "Functional.linear.1.forward": "Module.block.fc2.Linear.forward.0",
    "Module.block.fc2.Linear.forward.0": "Module.block.Block.forward.0",
    "Module.block.Block.forward.0": None,
    "Torch.matmul.0.forward": None,
    "Functional.softmax.0.forward": None,
    "Tensor.__matmul__.0.forward": None,
    "Functional.linear.2.forward": "Module.head.Linear.forward.0",
    "Module.head.Linear.forward.0": None,
}
#: L1 dumps have no module records: where the expected module activations show up instead
L1_EQUIVALENT = {
    "Module.block.fc1.Linear.forward.0.input.0": "Functional.linear.0.forward.input.0",
    "Module.block.fc1.Linear.forward.0.output.0": "Functional.linear.0.forward.output.0",
    "Module.block.Block.forward.0.output.0": "Functional.linear.1.forward.output.0",
    "Module.head.Linear.forward.0.parameters.weight": "Functional.linear.2.forward.input.1",
    "Module.head.Linear.forward.0.output.0": "Functional.linear.2.forward.output.0",
}


def calls(records: Iterable[Record]) -> list[str]:
    return list(dict.fromkeys(r.name for r in records))


def make_dumps_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_dumps", MSPROBE_FIXTURES / "make_dumps.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def edit_dump_json(rank_dir: Path, edit: Callable[[dict[str, Any]], object]) -> None:
    path = rank_dir / "dump.json"
    content = json.loads(path.read_text())
    edit(content)
    path.write_text(json.dumps(content))


@pytest.mark.parametrize("case", CASES)
def test_record_counts_steps_and_ranks(case: str) -> None:
    records, with_files, steps, ranks = CASES[case]
    dump = load_dump(MSPROBE_FIXTURES / case)
    assert dump.format == "msprobe"
    assert len(dump) == records
    assert sum(r.loader is not None for r in dump) == with_files
    data_files = list((MSPROBE_FIXTURES / case).rglob("dump_tensor_data/*.pt"))
    assert len(data_files) == with_files
    assert {r.step for r in dump} == steps
    assert {r.rank for r in dump} == ranks
    order = [(r.step, r.rank) for r in dump]
    assert order == sorted(order)


def test_mix_calls_parents_and_modules_follow_construct_json() -> None:
    dump = load_dump(MSPROBE_FIXTURES / "mix_tensor_steps")
    for step in (0, 1):
        step_records = [r for r in dump if r.step == step]
        assert calls(step_records) == MIX_CALLS
        assert {r.name: r.parent for r in step_records} == MIX_PARENTS
    by_name = {r.name: r for r in dump}
    linear = by_name["Functional.linear.0.forward"]
    assert (linear.kind, linear.op, linear.module) == ("Functional", "linear", "block.fc1")
    fc1 = by_name["Module.block.fc1.Linear.forward.0"]
    assert (fc1.kind, fc1.op, fc1.module) == ("Module", "Linear", "block.fc1")
    matmul = by_name["Tensor.__matmul__.0.forward"]
    assert (matmul.kind, matmul.op, matmul.module) == ("Tensor", "__matmul__", None)
    assert by_name["Torch.matmul.0.forward"].op == "matmul"


def test_l0_has_module_calls_forward_then_backward() -> None:
    dump = load_dump(MSPROBE_FIXTURES / "l0_tensor")
    parents = {r.name: r.parent for r in dump}
    assert list(parents) == [
        "Module.block.fc1.Linear.forward.0",
        "Module.block.act.GELU.forward.0",
        "Module.block.fc2.Linear.forward.0",
        "Module.block.Block.forward.0",
        "Module.head.Linear.forward.0",
        "Module.head.Linear.parameters_grad.0",
        "Module.head.Linear.backward.0",
        "Module.block.Block.backward.0",
        "Module.block.fc2.Linear.parameters_grad.0",
        "Module.block.fc2.Linear.backward.0",
        "Module.block.act.GELU.backward.0",
        "Module.block.fc1.Linear.backward.0",
        "Module.block.fc1.Linear.parameters_grad.0",
    ]
    inside_block = [name for name, parent in parents.items() if parent is not None]
    assert inside_block == MIX_CALLS[1:6:2]
    assert {parents[name] for name in inside_block} == {"Module.block.Block.forward.0"}


def test_l1_has_op_calls_without_modules_or_parents() -> None:
    dump = load_dump(MSPROBE_FIXTURES / "l1_tensor_ranks")
    for rank in (0, 1):
        rank_records = [r for r in dump if r.rank == rank]
        assert calls(rank_records) == [name for name in MIX_CALLS if not name.startswith("Module")]
        assert {(r.parent, r.module) for r in rank_records} == {(None, None)}


def test_slots_and_non_tensor_arguments() -> None:
    dump = load_dump(MSPROBE_FIXTURES / "mix_tensor_steps")
    step0 = {r.key: r for r in dump if r.step == 0}
    assert [k for k in step0 if k.startswith("Module.block.fc1.")] == [
        "Module.block.fc1.Linear.forward.0.input.0",
        "Module.block.fc1.Linear.forward.0.output.0",
        "Module.block.fc1.Linear.forward.0.parameters.weight",
        "Module.block.fc1.Linear.forward.0.parameters.bias",
    ]
    dim = step0["Functional.softmax.0.forward.kwargs.dim"]
    assert (dim.dtype, dim.value, dim.load()) == (None, -1, None)
    assert step0["Functional.gelu.0.forward.kwargs.approximate"].value == "none"
    head = step0["Module.head.Linear.forward.0.output.0"]
    assert (head.dtype, head.shape) == ("bfloat16", (3, 4))


def test_backward_and_parameter_gradients() -> None:
    dump = load_dump(MSPROBE_FIXTURES / "l0_tensor")
    keys = [r.key for r in dump]
    assert "Module.block.fc2.Linear.backward.0.input.0" in keys
    assert "Module.block.fc2.Linear.backward.0.output.0" in keys
    grad = next(
        r for r in dump if r.key == "Module.head.Linear.parameters_grad.0.parameters.weight.0"
    )
    assert (grad.kind, grad.op, grad.module, grad.dtype) == ("Module", "Linear", "head", "bfloat16")
    weight = next(r for r in dump if r.key == "Module.head.Linear.forward.0.parameters.weight")
    tensor = grad.load()
    assert tensor is not None
    assert tensor.shape == weight.shape


@pytest.mark.parametrize("case", TENSOR_CASES)
def test_tensors_are_bitwise_what_the_model_produced(case: str) -> None:
    expected = load_file(MSPROBE_FIXTURES / case / "expected.safetensors")
    dump = load_dump(MSPROBE_FIXTURES / case)
    by_key = {(r.step, r.rank, r.key): r for r in dump}
    compared = 0
    for stored_key, tensor in expected.items():
        step, key = stored_key.split("/")
        key = L1_EQUIVALENT[key] if case.startswith("l1") else key
        for rank in {r.rank for r in dump}:
            assert_bitwise_equal(by_key[int(step.removeprefix("step")), rank, key].load(), tensor)
            compared += 1
    assert compared >= 5
    assert any(t.dtype == torch.bfloat16 for t in expected.values())


def test_inputs_and_parameters_match_a_recomputed_model() -> None:
    make_dumps = make_dumps_module()
    model = make_dumps.make_model()
    by_key = {(r.step, r.key): r for r in load_dump(MSPROBE_FIXTURES / "mix_tensor_steps")}
    for step in (0, 1):
        record = by_key[step, "Module.block.fc1.Linear.forward.0.input.0"]
        assert_bitwise_equal(record.load(), make_dumps.make_inputs(step))
    for module, param in [("block.fc2", "bias"), ("head", "weight")]:
        cls = "Linear"
        record = by_key[0, f"Module.{module}.{cls}.forward.0.parameters.{param}"]
        assert_bitwise_equal(record.load(), model.get_parameter(f"{module}.{param}").detach())


@pytest.mark.parametrize("case", TENSOR_CASES)
def test_statistics_describe_the_loaded_tensor(case: str) -> None:
    for record in load_dump(MSPROBE_FIXTURES / case):
        if record.loader is None:
            continue
        tensor = record.load()
        assert tensor is not None
        assert record.stats is not None
        assert record.stats.numel == tensor.numel()
        assert record.stats.max == float(tensor.max())
        assert record.stats.min == float(tensor.min())
        assert record.stats.mean == pytest.approx(float(tensor.double().mean()), rel=1e-2, abs=1e-3)
        assert (record.stats.nan_count, record.stats.posinf_count) == (0, 0)


def test_statistics_dump_has_the_tensor_dumps_statistics_and_no_data() -> None:
    stats_dump = load_dump(MSPROBE_FIXTURES / "mix_statistics")
    tensor_dump = load_dump(MSPROBE_FIXTURES / "mix_tensor_steps")
    tensor_stats = {r.key: r.stats for r in tensor_dump if r.step == 0}
    assert [r.key for r in stats_dump] == list(tensor_stats)
    for record in stats_dump:
        assert record.load() is None
        assert record.stats == tensor_stats[record.key]


def test_md5_checksums_are_the_crc32_of_the_tensor_bytes() -> None:
    tensors = {r.key: r for r in load_dump(MSPROBE_FIXTURES / "l1_tensor_ranks") if r.rank == 0}
    checked = 0
    for record in load_dump(MSPROBE_FIXTURES / "l1_md5"):
        if not record.is_tensor:
            continue
        tensor = tensors[record.key].load()
        assert tensor is not None
        data = tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        assert record.checksum == f"{zlib.crc32(data):08x}"
        checked += 1
    assert checked == 22


def test_non_finite_statistics_flag_nan_and_inf(rank_copy: Path) -> None:
    def poison(content: dict[str, Any]) -> None:
        first = content["data"]["Functional.linear.0.forward"]
        first["input_args"][0].update(Max=math.nan, Mean=math.nan)
        first["output"][0].update(Max=math.inf, Min=-math.inf)

    edit_dump_json(rank_copy, poison)
    by_key = {r.key: r for r in load_dump(rank_copy.parent.parent)}
    nan_stats = by_key["Functional.linear.0.forward.input.0"].stats
    assert nan_stats is not None
    assert (nan_stats.nan_count, nan_stats.posinf_count) == (1, 0)
    inf_stats = by_key["Functional.linear.0.forward.output.0"].stats
    assert inf_stats is not None
    assert (inf_stats.nan_count, inf_stats.posinf_count, inf_stats.neginf_count) == (0, 1, 1)


@pytest.mark.parametrize("entry", ["root", "step", "rank", "dump.json"])
def test_loads_from_any_level_of_the_tree(entry: str) -> None:
    root = MSPROBE_FIXTURES / "l1_tensor_ranks"
    path = {
        "root": root,
        "step": root / "step0",
        "rank": root / "step0" / "rank1",
        "dump.json": root / "step0" / "rank1" / "dump.json",
    }[entry]
    dump = load_dump(path)
    assert len(dump) == (48 if entry in ("root", "step") else 24)
    assert max(r.rank for r in dump) == 1


def test_dump_data_dir_from_the_recording_machine_is_ignored(rank_copy: Path) -> None:
    edit_dump_json(rank_copy, lambda content: content.update(dump_data_dir="/etc"))
    record = next(r for r in load_dump(rank_copy) if r.loader is not None)
    assert_bitwise_equal(
        record.load(), torch.load(rank_copy / "dump_tensor_data" / f"{record.key}.pt")
    )


def test_records_load_lazily(rank_copy: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(path: Path) -> torch.Tensor:
        raise AssertionError(f"{path} read during load_dump")

    monkeypatch.setattr("pytest_precision.dump._msprobe.load_pt_tensor", refuse)
    dump = load_dump(rank_copy)
    assert sum(r.loader is not None for r in dump) == 38


@pytest.mark.skipif(not Path("/proc/self/maps").is_file(), reason="reads Linux's /proc")
def test_tensors_are_mapped_from_their_files_and_unmapped_when_dropped(rank_copy: Path) -> None:
    """A record's tensor is its data file memory-mapped, not a copy, and dropping the tensor
    unmaps the file: comparing a dump larger than memory holds one pair at a time."""
    record = next(r for r in load_dump(rank_copy) if r.loader is not None)
    file = str(rank_copy / "dump_tensor_data" / f"{record.key}.pt")
    tensor = record.load()
    assert file in Path("/proc/self/maps").read_text()
    del tensor
    assert file not in Path("/proc/self/maps").read_text()


def test_npy_data_files_with_bfloat16_widened_to_float32(rank_copy: Path) -> None:
    """MindSpore's msprobe writes .npy, widening bfloat16 to float32; loading narrows it back."""
    originals = {r.key: r.load() for r in load_dump(rank_copy) if r.loader is not None}
    data_dir = rank_copy / "dump_tensor_data"
    for pt in data_dir.glob("*.pt"):
        tensor = torch.load(pt, weights_only=True)
        wide = tensor.float() if tensor.dtype == torch.bfloat16 else tensor
        np.save(pt.with_suffix(".npy"), wide.numpy())
        pt.unlink()

    def to_npy(content: dict[str, Any]) -> None:
        for call in content["data"].values():
            for args in (call.get("input_args", []), call.get("output", [])):
                for arg in args:
                    if isinstance(arg, dict) and "data_name" in arg:
                        arg["data_name"] = arg["data_name"].replace(".pt", ".npy")
                        arg["dtype"] = arg["dtype"].replace("torch.bfloat16", "BFloat16")
            for param in call.get("parameters", {}).values():
                param["data_name"] = param["data_name"].replace(".pt", ".npy")

    edit_dump_json(rank_copy, to_npy)
    reloaded = {r.key: r.load() for r in load_dump(rank_copy) if r.loader is not None}
    assert reloaded.keys() == originals.keys()
    for key, tensor in originals.items():
        assert tensor is not None
        assert_bitwise_equal(reloaded[key], tensor)
    assert any(t is not None and t.dtype == torch.bfloat16 for t in reloaded.values())


# ---- bad input ------------------------------------------------------------------------------


def test_pickle_payload_in_a_data_file_is_refused_and_never_runs(
    rank_copy: Path, tmp_path: Path
) -> None:
    marker = tmp_path / "payload-ran"
    victim = rank_copy / "dump_tensor_data" / "Functional.linear.0.forward.input.0.pt"
    write_pickle_payload(victim, marker)
    record = next(r for r in load_dump(rank_copy) if r.key == "Functional.linear.0.forward.input.0")
    with pytest.raises(DumpFormatError, match="cannot be loaded safely") as info:
        record.load()
    assert info.value.path == str(victim)
    assert not marker.exists()


@pytest.mark.parametrize("file", ["dump.json", "construct.json"])
def test_malformed_json_names_the_file(rank_copy: Path, file: str) -> None:
    (rank_copy / file).write_text('{"data": {"Functional.linear.0.forward": ')
    with pytest.raises(DumpFormatError, match="malformed JSON") as info:
        load_dump(rank_copy)
    assert info.value.path == str(rank_copy / file)


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ({"task": "tensor"}, 'no "data" object'),
        ({"data": {"Functional.linear.0.forward": [1, 2]}}, "is not a JSON object"),
        (
            {"data": {"Torch.add.0.forward": {"output": [{"dtype": "torch.float32", "shape": 3}]}}},
            "shape 3 is not a list of ints",
        ),
    ],
)
def test_wrong_dump_json_schema(rank_copy: Path, content: dict[str, Any], problem: str) -> None:
    (rank_copy / "dump.json").write_text(json.dumps(content))
    with pytest.raises(DumpFormatError, match=problem):
        load_dump(rank_copy)


def test_construct_json_of_the_wrong_shape(rank_copy: Path) -> None:
    (rank_copy / "construct.json").write_text(json.dumps({"Functional.linear.0.forward": 3}))
    with pytest.raises(DumpFormatError, match=r"construct\.json"):
        load_dump(rank_copy)


def test_missing_data_file_names_it(rank_copy: Path) -> None:
    missing = rank_copy / "dump_tensor_data" / "Torch.matmul.0.forward.output.0.pt"
    missing.unlink()
    with pytest.raises(DumpFormatError, match="missing: data file of record") as info:
        load_dump(rank_copy)
    assert info.value.path == str(missing)


@pytest.mark.parametrize(
    "data_name", ["../../etc/passwd", "/etc/passwd", "../dump.json", "link.pt"]
)
def test_data_paths_outside_the_dump_are_refused(rank_copy: Path, data_name: str) -> None:
    (rank_copy / "dump_tensor_data" / "link.pt").symlink_to("/etc/passwd")

    def redirect(content: dict[str, Any]) -> None:
        content["data"]["Functional.linear.0.forward"]["input_args"][0]["data_name"] = data_name

    edit_dump_json(rank_copy, redirect)
    with pytest.raises(DumpFormatError, match="points outside") as info:
        load_dump(rank_copy)
    assert info.value.path == str(rank_copy / "dump.json")
    assert data_name in str(info.value)


def test_truncated_data_file(rank_copy: Path) -> None:
    file = rank_copy / "dump_tensor_data" / "Torch.matmul.0.forward.output.0.pt"
    file.write_bytes(file.read_bytes()[:300])
    record = next(r for r in load_dump(rank_copy) if r.key == "Torch.matmul.0.forward.output.0")
    with pytest.raises(DumpFormatError) as info:
        record.load()
    assert info.value.path == str(file)


def test_data_file_that_disagrees_with_dump_json(rank_copy: Path) -> None:
    file = rank_copy / "dump_tensor_data" / "Torch.matmul.0.forward.output.0.pt"
    torch.save(torch.zeros(2, dtype=torch.float16), file)
    record = next(r for r in load_dump(rank_copy) if r.key == "Torch.matmul.0.forward.output.0")
    with pytest.raises(DumpFormatError, match=r"holds float16 \[2\], dump.json records float32"):
        record.load()


def test_incomplete_dump(rank_copy: Path) -> None:
    (rank_copy.parent.parent / "step1" / "rank0").mkdir(parents=True)
    with pytest.raises(DumpFormatError, match="missing: incomplete msprobe dump") as info:
        load_dump(rank_copy.parent.parent)
    assert info.value.path.endswith("step1/rank0/dump.json")
