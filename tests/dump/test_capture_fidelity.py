"""Capture on a real tiny Llama: records equal, bit for bit, what the model and its ops
produced (checked against independent hooks), and capturing never changes the numerics."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from dump_helpers import CONFIG
from torch.overrides import TorchFunctionMode

from examples.tiny_llama import build_tiny_llama, example_input_ids
from pytest_precision import Record, capture, tensor_stats
from pytest_precision.dump._native import read_native_dump

LEVELS = ("module", "op", "mix")
MODES = ("tensor", "statistics")


def _bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


def _module_outputs(model: torch.nn.Module) -> tuple[dict[str, torch.Tensor], list[Any]]:
    """Independent oracle: plain forward hooks copying every module output, keyed like records."""
    outputs: dict[str, torch.Tensor] = {}
    calls: dict[str, int] = defaultdict(int)
    handles = []
    for path, module in model.named_modules():

        def hook(mod: torch.nn.Module, args: Any, out: Any, path: str = path) -> None:
            count = calls[path]
            calls[path] += 1
            prefix = f"Module.{path}." if path else "Module."
            name = f"{prefix}{type(mod).__name__}.forward.{count}"
            items = out if isinstance(out, tuple) else (out,)
            for i, item in enumerate(items):
                outputs[f"{name}.output.{i}"] = item.detach().clone()

        handles.append(module.register_forward_hook(hook))
    return outputs, handles


@pytest.fixture(scope="module", params=[torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def model(request: pytest.FixtureRequest) -> torch.nn.Module:
    return build_tiny_llama(CONFIG, seed=0, dtype=request.param)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("level", LEVELS)
def test_round_trip_is_bitwise_and_numerics_do_not_change(
    model: torch.nn.Module, tmp_path: Path, level: str, mode: str
) -> None:
    ids = example_input_ids(CONFIG, seq=12)
    with torch.no_grad():
        plain = model(ids)
        expected, handles = _module_outputs(model)
        with _OpOutputs() as ops, capture(model, tmp_path, level=level, mode=mode):  # type: ignore[arg-type]
            captured = model(ids)
        for handle in handles:
            handle.remove()
    assert _bitwise_equal(captured, plain), "capture changed the model's output"

    dump = read_native_dump(tmp_path)
    records = {r.key: r for r in dump}
    kinds = {r.kind for r in dump}
    assert ("Module" in kinds) == (level != "op")
    assert bool(kinds - {"Module"}) == (level != "module")
    for record in dump:
        assert record.rank == 0
        assert record.step == 0
        if record.is_tensor and record.stats is not None:
            assert record.stats.numel == (torch.Size(record.shape).numel() or 0)
        if mode == "statistics":
            assert record.load() is None
        elif record.is_tensor:
            loaded = record.load()
            assert loaded is not None
            assert record.dtype == str(loaded.dtype).removeprefix("torch.")
            assert repr(record.stats) == repr(tensor_stats(loaded)), record.key

    if level != "op":  # every module output, against the independent hooks
        module_keys = [key for key in expected if key in records]
        assert len(module_keys) == len(expected)
        if mode == "tensor":
            for key in module_keys:
                assert _bitwise_equal(records[key].load(), expected[key]), key
        else:
            for key in module_keys:
                assert repr(records[key].stats) == repr(tensor_stats(expected[key])), key
    if mode == "tensor" and level != "module":
        _check_linear_records(dump.records, model)
        _check_op_outputs(dump.records, ops.outputs)
    last_output = [r for r in dump if r.slot == "output.0"][-1]
    if mode == "tensor":
        assert _bitwise_equal(last_output.load(), plain)
    else:
        assert repr(last_output.stats) == repr(tensor_stats(plain))


class _OpOutputs(TorchFunctionMode):
    """Independent oracle: a second mode, below capture's, copying every tensor a call returns
    (capture's own copies show up too; the check skips what it does not need)."""

    def __init__(self) -> None:
        super().__init__()
        self.outputs: list[torch.Tensor] = []

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        output = func(*args, **(kwargs or {}))
        items = output if isinstance(output, (tuple, list)) else (output,)
        self.outputs += [t.detach().clone() for t in items if isinstance(t, torch.Tensor)]
        return output


def _check_op_outputs(records: Any, oracle: list[torch.Tensor]) -> None:
    """Every recorded op output is, in order, one of the tensors the calls really returned."""
    position = 0
    for record in records:
        if record.kind == "Module" or not record.slot.startswith("output.") or not record.is_tensor:
            continue
        loaded = record.load()
        while position < len(oracle) and not _bitwise_equal(oracle[position], loaded):
            position += 1
        assert position < len(oracle), f"{record.key} is not what the op returned"
        position += 1


def _check_linear_records(records: Any, model: torch.nn.Module) -> None:
    """Each F.linear record: weight is the module's parameter, output recomputes bitwise."""
    by_name: dict[str, dict[str, Record]] = defaultdict(dict)
    for r in records:
        if r.name.startswith("Functional.linear."):
            by_name[r.name][r.slot] = r
    assert len(by_name) == 7 * CONFIG.num_layers + 1
    params = dict(model.named_parameters())
    for name, slots in by_name.items():
        module = slots["output.0"].module
        weight = slots["input.1"].load()
        assert _bitwise_equal(weight, params[f"{module}.weight"]), name
        recomputed = F.linear(slots["input.0"].load(), weight)
        assert _bitwise_equal(slots["output.0"].load(), recomputed), name


class _InPlace(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        y.add_(1)  # in place: its input must be recorded before the call
        return y.mul(3)


@pytest.mark.parametrize("inference", [False, True], ids=["grad-mode", "inference-mode"])
def test_in_place_ops_record_inputs_before_the_call(tmp_path: Path, inference: bool) -> None:
    x = torch.arange(4.0)
    with torch.inference_mode(inference), capture(_InPlace(), tmp_path, level="op") as cap:
        x.add(0)  # outside the model's forward: not recorded
        cap.model(x)
    dump = read_native_dump(tmp_path)
    by_key = {r.key: r.load() for r in dump if r.is_tensor}
    assert torch.equal(by_key["Tensor.add_.0.forward.input.0"], x * 2)
    assert torch.equal(by_key["Tensor.add_.0.forward.output.0"], x * 2 + 1)
    # The output of add_ is the same object as mul's input, but changed: not deduplicated.
    assert torch.equal(by_key["Tensor.mul.1.forward.input.0"], x * 2 + 1)
    assert "Tensor.add.0.forward.input.0" not in by_key


@pytest.mark.parametrize("level", LEVELS)
def test_capture_under_inference_mode(tmp_path: Path, level: str) -> None:
    model = build_tiny_llama(CONFIG)
    ids = example_input_ids(CONFIG, seq=6)
    with torch.inference_mode():
        plain = model(ids)
        with capture(model, tmp_path, level=level):  # type: ignore[arg-type]
            captured = model(ids)
    assert _bitwise_equal(captured, plain)
    dump = read_native_dump(tmp_path)
    logits = [r for r in dump if r.slot == "output.0"][-1]
    assert _bitwise_equal(logits.load(), plain)
    for record in dump:
        if record.is_tensor:
            assert repr(record.stats) == repr(tensor_stats(record.load())), record.key


# -- found in review -------------------------------------------------------------------------------


class _WritesThroughAView(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * 1
        y[0].fill_(7.0)  # a write through a view, as KV-cache updates do
        return torch.relu(y)


@pytest.mark.parametrize("grad_mode", [torch.no_grad, torch.inference_mode])
def test_writes_through_a_view_are_seen(tmp_path: Path, grad_mode: Any) -> None:
    model = _WritesThroughAView()
    with grad_mode(), capture(model, tmp_path / "d", level="op"):
        model(torch.arange(4.0))
    relu = {r.slot: r.load() for r in read_native_dump(tmp_path / "d") if r.op == "relu"}
    assert relu["input.0"].tolist() == [7.0, 1.0, 2.0, 3.0]


class _Conj(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.conj() * 1


def test_statistics_of_conjugate_complex_values(tmp_path: Path) -> None:
    model = _Conj()
    with capture(model, tmp_path / "d", level="op", mode="statistics"):
        model(torch.tensor([1 + 2j, 3 - 1j]))
    stats = [r.stats for r in read_native_dump(tmp_path / "d") if r.slot == "output.0"]
    assert stats[0] is not None
    assert stats[0].numel == 2
