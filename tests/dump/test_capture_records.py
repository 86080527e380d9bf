"""What a capture writes: record names, modules and parents, calls, filters, steps, slots and
ranks, and how it finalizes, refuses or warns when a run fails or is misused."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
from dump_helpers import CONFIG

from examples.tiny_llama import build_tiny_llama, example_input_ids, greedy_generate
from pytest_precision import (
    DumpFormatError,
    PrecisionError,
    PrecisionInputError,
    PrecisionWarning,
    capture,
)
from pytest_precision.dump import _capture
from pytest_precision.dump._native import read_native_dump

ROOT = Path(__file__).resolve().parents[2]  # for subprocesses importing examples/


def test_names_modules_and_parents_follow_the_conventions(tmp_path: Path) -> None:
    model = build_tiny_llama(CONFIG)
    with torch.no_grad(), capture(model, tmp_path, mode="statistics"):
        model(example_input_ids(CONFIG, seq=8))
    dump = read_native_dump(tmp_path)
    by_key = {r.key: r for r in dump}
    down = by_key["Module.model.layers.0.mlp.down_proj.Linear.forward.0.output.0"]
    assert (down.kind, down.op, down.module) == ("Module", "Linear", "model.layers.0.mlp.down_proj")
    assert down.parent == "Module.model.layers.0.mlp.MLP.forward.0"
    weight = by_key["Module.model.layers.0.mlp.down_proj.Linear.forward.0.parameters.weight"]
    assert weight.dtype == "float32"
    assert weight.shape == (CONFIG.hidden_size, CONFIG.intermediate_size)
    root = dump.records[0]
    assert (root.name, root.module, root.parent) == (
        "Module.TinyLlamaForCausalLM.forward.0",
        "",
        None,
    )
    q = by_key["Functional.linear.0.forward.output.0"]
    assert (q.kind, q.op, q.module) == ("Functional", "linear", "model.layers.0.self_attn.q_proj")
    assert q.parent == "Module.model.layers.0.self_attn.q_proj.Linear.forward.0"
    # The seventh linear of the run is layer 0's down_proj: op counters are per api name.
    assert by_key["Functional.linear.6.forward.output.0"].module == "model.layers.0.mlp.down_proj"
    scores = by_key["Torch.matmul.0.forward.output.0"]
    assert scores.module == "model.layers.0.self_attn"
    softmax = by_key["Functional.softmax.0.forward.kwargs.dtype"]
    assert (softmax.dtype, softmax.value) == (None, "torch.float32")
    assert by_key["Tensor.masked_fill.0.forward.input.2"].value == float("-inf")
    # Pure metadata reads never become records.
    assert not {r.op for r in dump} & {"size", "dim", "shape", "dtype", "device"}


def test_calls_group_each_calls_records_in_the_order_calls_started(tmp_path: Path) -> None:
    model = build_tiny_llama(CONFIG)
    with torch.no_grad(), capture(model, tmp_path, mode="statistics") as cap:
        model(example_input_ids(CONFIG, seq=4))
        cap.step()
        model(example_input_ids(CONFIG, seq=5))
    dump = read_native_dump(tmp_path)
    calls = dump.calls
    assert sum(len(call.records) for call in calls) == len(dump)
    assert len({(c.step, c.name) for c in calls}) == len(calls)
    assert [(c.name, c.step) for c in calls[:2]] == [
        ("Module.TinyLlamaForCausalLM.forward.0", 0),
        ("Module.model.LlamaModel.forward.0", 0),
    ]
    names = [c.name for c in calls if c.step == 0]
    down = calls[names.index("Module.model.layers.0.mlp.down_proj.Linear.forward.0")]
    assert [r.slot for r in down.inputs] == ["input.0"]
    assert [r.slot for r in down.parameters] == ["parameters.weight"]
    assert [r.slot for r in down.outputs] == ["output.0"]
    # the linear inside down_proj started after its module and before the next module
    linear = names.index("Functional.linear.6.forward")
    assert names[linear - 1] == "Module.model.layers.0.mlp.down_proj.Linear.forward.0"
    softmax = calls[names.index("Functional.softmax.0.forward")]
    assert (softmax.kind, softmax.op, softmax.module) == (
        "Functional",
        "softmax",
        "model.layers.0.self_attn",
    )
    assert [r.slot for r in softmax.inputs] == [
        "input.0",
        "kwargs.dim",
        "kwargs._stacklevel",
        "kwargs.dtype",
    ]
    assert [c.step for c in calls] == sorted(c.step for c in calls)


def test_records_of_one_stored_tensor_share_a_data_id(tmp_path: Path) -> None:
    model = build_tiny_llama(CONFIG)
    with torch.no_grad(), capture(model, tmp_path, mode="tensor"):
        model(example_input_ids(CONFIG, seq=4))
    by_key = {r.key: r for r in read_native_dump(tmp_path)}
    weight = by_key["Module.model.layers.0.mlp.down_proj.Linear.forward.0.parameters.weight"]
    linear = by_key["Functional.linear.6.forward.input.1"]
    assert weight.data_id is not None
    assert weight.data_id == linear.data_id
    other = by_key["Functional.linear.5.forward.input.1"]  # up_proj's weight
    assert other.data_id != weight.data_id


def test_op_level_keeps_the_enclosing_module_without_parents(tmp_path: Path) -> None:
    model = build_tiny_llama(CONFIG)
    with torch.no_grad(), capture(model, tmp_path, level="op", mode="statistics"):
        model(example_input_ids(CONFIG, seq=8))
    dump = read_native_dump(tmp_path)
    q = next(r for r in dump if r.name == "Functional.linear.0.forward")
    assert (q.module, q.parent) == ("model.layers.0.self_attn.q_proj", None)


def test_include_and_exclude_filter_calls_by_name_or_module(tmp_path: Path) -> None:
    model = build_tiny_llama(CONFIG)
    ids = example_input_ids(CONFIG, seq=8)
    with torch.no_grad():
        with capture(model, tmp_path / "a", include="model.layers.1.*", exclude="Tensor.*"):
            model(ids)
        with capture(model, tmp_path / "b", level="op", include=["Functional.linear.*"]):
            model(ids)
    a = read_native_dump(tmp_path / "a")
    assert len(a) > 0
    assert all(r.module.startswith("model.layers.1.") for r in a)
    assert "Tensor" not in {r.kind for r in a}
    b = read_native_dump(tmp_path / "b")
    assert {r.name.rsplit(".", 2)[0] for r in b} == {"Functional.linear"}
    # Names count every call, kept or not: filtering never renames what is kept.
    assert "Functional.linear.14.forward" in {r.name for r in b}


def test_steps_separate_decode_steps_and_limit_capture(tmp_path: Path) -> None:
    model = build_tiny_llama(CONFIG)
    ids = example_input_ids(CONFIG, seq=6)
    with capture(model, tmp_path, level="module", steps=range(1, 3)) as cap:
        tokens = greedy_generate(model, ids, 4, on_step=lambda i: i and cap.step())
    assert torch.equal(tokens, greedy_generate(model, ids, 4))
    dump = read_native_dump(tmp_path)
    assert {r.step for r in dump} == {1, 2}
    roots = [r for r in dump if r.name == "Module.TinyLlamaForCausalLM.forward.0"]
    assert [(r.step, r.slot, r.shape) for r in roots] == [
        (1, "input.0", (1, 7)),
        (1, "output.0", (1, 7, CONFIG.vocab_size)),
        (2, "input.0", (1, 8)),
        (2, "output.0", (1, 8, CONFIG.vocab_size)),
    ]
    # A weight is stored once and shared by later steps.
    weights = [r for r in dump if r.key.endswith("lm_head.Linear.forward.0.parameters.weight")]
    assert len(weights) == 2
    assert torch.equal(weights[0].load(), weights[1].load())


class _Nested(torch.nn.Module):
    def forward(self, pair: tuple[torch.Tensor, torch.Tensor], *, scale: float) -> dict[str, Any]:
        a, b = pair
        return {"sum": a + b, "cache": (a * scale, b * scale)}


def test_nested_containers_get_dotted_slots(tmp_path: Path) -> None:
    a, b = torch.ones(2), torch.zeros(2)
    with capture(_Nested(), tmp_path, level="module") as cap:
        cap.model((a, b), scale=2.0)
    slots = {r.slot: r for r in read_native_dump(tmp_path)}
    assert set(slots) == {
        "input.0.0",
        "input.0.1",
        "kwargs.scale",
        "output.0.sum",
        "output.0.cache.0",
        "output.0.cache.1",
    }
    assert slots["kwargs.scale"].value == 2.0
    assert torch.equal(slots["output.0.cache.0"].load(), a * 2)


def test_rank_comes_from_torch_distributed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = build_tiny_llama(CONFIG)
    ids = example_input_ids(CONFIG, seq=4)
    for rank in (1, 0):  # rank 0 writes the manifest; the order does not matter
        monkeypatch.setattr(_capture, "rank_and_world_size", lambda rank=rank: (rank, 2))
        with torch.no_grad(), capture(model, tmp_path, level="module", mode="statistics"):
            model(ids)
    dump = read_native_dump(tmp_path)
    assert sorted({r.rank for r in dump}) == [0, 1]
    assert (tmp_path / "rank1" / "records.jsonl").is_file()
    assert len([r for r in dump if r.rank == 0]) == len([r for r in dump if r.rank == 1])


def test_a_dump_cut_short_by_a_crash_is_incomplete(tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import os, sys, torch
        sys.path.insert(0, {str(ROOT)!r})
        from examples.tiny_llama import build_tiny_llama, example_input_ids
        from pytest_precision import capture
        model = build_tiny_llama()
        with capture(model, {str(tmp_path)!r}):
            model(example_input_ids())
            os._exit(3)  # the process dies inside the capture
        """
    )
    result = subprocess.run([sys.executable, "-c", script], check=False, timeout=120)
    assert result.returncode == 3
    with pytest.raises(DumpFormatError, match="incomplete dump"):
        read_native_dump(tmp_path)


def test_an_exception_in_the_forward_still_finalizes_and_unhooks(tmp_path: Path) -> None:
    model = build_tiny_llama(CONFIG)
    with pytest.raises(ValueError, match="unpack"), capture(model, tmp_path, level="mix"):
        model(torch.zeros(1, 3, 3, dtype=torch.long))  # wrong rank: fails inside the forward
    assert len(read_native_dump(tmp_path)) > 0
    assert not model.lm_head._forward_hooks
    assert not model.lm_head._forward_pre_hooks
    assert not torch.overrides._get_current_function_mode_stack()


def test_bad_arguments_and_existing_dumps_are_refused(tmp_path: Path) -> None:
    model = build_tiny_llama(CONFIG)
    with pytest.raises(PrecisionInputError, match="level"):
        capture(model, tmp_path, level="L1")  # type: ignore[arg-type]
    with pytest.raises(PrecisionInputError, match="mode"):
        capture(model, tmp_path, mode="md5")  # type: ignore[arg-type]
    with pytest.raises(PrecisionInputError, match=r"torch\.nn\.Module"):
        capture(lambda x: x, tmp_path)  # type: ignore[arg-type]
    with capture(model, tmp_path, level="module", mode="statistics"):
        pass
    with pytest.raises(PrecisionError, match="already holds a dump"), capture(model, tmp_path):
        pass


def test_load_dump_recognizes_a_capture(tmp_path: Path) -> None:
    from pytest_precision import load_dump

    model = build_tiny_llama(CONFIG)
    with torch.no_grad(), capture(model, tmp_path, level="mix"):
        model(example_input_ids(CONFIG, seq=4))
    dump = load_dump(tmp_path)
    assert dump.format == "native"
    assert [r.key for r in dump] == [r.key for r in read_native_dump(tmp_path)]


_TWO_RANKS = """
import sys, torch, torch.distributed as dist, torch.multiprocessing as mp
sys.path.insert(0, {root!r})
from examples.tiny_llama import build_tiny_llama, example_input_ids
from pytest_precision import capture

def run(rank):
    dist.init_process_group("gloo", init_method="file://{store}", rank=rank, world_size=2)
    model = build_tiny_llama()
    with torch.no_grad(), capture(model, {dump!r}, level="module", mode="statistics"):
        model(example_input_ids(seed=rank))
    dist.barrier()
    dist.destroy_process_group()

if __name__ == "__main__":
    mp.spawn(run, nprocs=2)
"""


@pytest.mark.slow
def test_each_rank_of_a_real_process_group_writes_its_folder(tmp_path: Path) -> None:
    script = tmp_path / "two_ranks.py"
    dump = tmp_path / "dump"
    script.write_text(_TWO_RANKS.format(root=str(ROOT), store=tmp_path / "store", dump=str(dump)))
    subprocess.run([sys.executable, str(script)], check=True, timeout=300)
    records = read_native_dump(dump).records
    assert sorted({r.rank for r in records}) == [0, 1]
    logits = [r for r in records if r.key == "Module.TinyLlamaForCausalLM.forward.0.output.0"]
    assert len(logits) == 2
    assert logits[0].stats != logits[1].stats  # each rank saw its own input


# -- found in review -------------------------------------------------------------------------------


@dataclasses.dataclass
class _Pair:
    a: torch.Tensor
    b: torch.Tensor


class _ReturnsADataclass(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> _Pair:
        return _Pair(x + 1, x * 2)


def test_dataclass_outputs_are_recorded_field_by_field(tmp_path: Path) -> None:
    model = _ReturnsADataclass()
    with capture(model, tmp_path / "d", level="module"):
        out = model(torch.arange(3.0))
    records = {r.slot: r for r in read_native_dump(tmp_path / "d")}
    assert torch.equal(records["output.0.a"].load(), out.a)
    assert torch.equal(records["output.0.b"].load(), out.b)


class _Raises(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.fc(x)
        raise RuntimeError("boom")


def test_a_failed_forward_records_no_output_and_says_what_ended_it(tmp_path: Path) -> None:
    model = _Raises()
    with pytest.raises(RuntimeError, match="boom"), capture(model, tmp_path / "d", level="module"):
        model(torch.ones(1, 2))
    dump = read_native_dump(tmp_path / "d")
    outputs = [(r.name, r.slot) for r in dump if r.slot.startswith("output")]
    assert outputs == [("Module.fc.Linear.forward.0", "output.0")]  # only the child finished
    manifest = json.loads((tmp_path / "d" / "manifest.json").read_text())
    assert "boom" in manifest["interrupted_by"]


def test_op_level_warns_about_fused_fast_paths(tmp_path: Path) -> None:
    layer = torch.nn.TransformerEncoderLayer(16, 2, 32, batch_first=True, dropout=0.0).eval()
    with (
        pytest.warns(PrecisionWarning, match="TransformerEncoderLayer skip its fused fast path"),
        capture(layer, tmp_path / "d", level="op", mode="statistics"),
    ):
        pass
