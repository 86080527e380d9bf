"""Which recorded calls resolve to a torch callable and rebuild their arguments, NPU ops
included, and which are refused as not replayable, with the reason."""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from dump_helpers import assert_bitwise_equal
from rerun_helpers import Lambda, capture_ops, make_call, op_calls

from pytest_precision import PrecisionError
from pytest_precision.rerun._arguments import rebuild_arguments
from pytest_precision.rerun._ops import NotReplayable, resolve_op
from pytest_precision.rerun._recompute import recompute

# -- 3. what cannot be replayed -------------------------------------------------------------------


def _assorted(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return (
        F.dropout(x, 0.5, training=True),
        F.dropout(x, 0.5, training=False),
        F.alpha_dropout(x, 0.5),
        torch.rand_like(x),
        torch.empty_like(x),
        x.new_empty(3),
        x.sigmoid().bernoulli(),
        x.T,
        x.mT,
        1 - x,
        x.float().half(),
        x.to("cpu", torch.float16),
        torch.linalg.vector_norm(x, dim=-1),
        torch.special.expit(x),
        torch.zeros(2, device="cpu", dtype=torch.float16),
        x[[0, 2]],
        torch.max(x, dim=-1),
    )


#: Calls of _assorted that are not replayable, and why.
REFUSED = {
    "Functional.dropout.0.forward": "random op: dropout with training=True",
    "Torch.rand_like.0.forward": "random op",
    "Torch.empty_like.0.forward": "uninitialized memory",
    "Tensor.new_empty.0.forward": "uninitialized memory",
    "Tensor.bernoulli.0.forward": "random op",
    # a list index is recorded as a JSON list, like a tuple index: the rebuilt tuple gives
    # another shape, which the rerun detects
    "Tensor.__getitem__.0.forward": "could not be rebuilt faithfully",
}


def test_assorted_ops(tmp_path: Path) -> None:
    x = torch.randn(3, 4)
    dump, _ = capture_ops(Lambda(_assorted), tmp_path, x)
    calls = op_calls(dump)
    for name, call in calls.items():
        if name in REFUSED:
            with pytest.raises(NotReplayable, match=REFUSED[name]):
                recompute(call, dtype=None)
            continue
        outputs = recompute(call, dtype=None)
        for record in call.outputs:
            if record.is_tensor:
                assert_bitwise_equal(outputs[record.slot], record.load())
        for record in call.outputs:  # and at float64 every floating result is float64
            if record.dtype is not None and record.dtype.startswith(("float", "bfloat")):
                assert recompute(call)[record.slot].dtype == torch.float64, name
    assert set(REFUSED) < set(calls)
    assert resolve_op(calls["Tensor.T.0.forward"])(x) is not None
    assert resolve_op(calls["Torch.linalg_vector_norm.0.forward"]) is torch.linalg.vector_norm
    assert resolve_op(calls["Torch.special_expit.0.forward"]) is torch.special.expit
    assert resolve_op(calls["Tensor.__rsub__.0.forward"]) is torch.Tensor.__rsub__
    assert resolve_op(calls["Functional.dropout.1.forward"]) is F.dropout  # training=False
    assert resolve_op(calls["Functional.alpha_dropout.0.forward"]) is F.alpha_dropout  # default


def test_statistics_only_dump_names_the_missing_data(tmp_path: Path) -> None:
    dump, _ = capture_ops(Lambda(lambda x: x.exp()), tmp_path, torch.randn(3), mode="statistics")
    (call,) = op_calls(dump).values()
    assert resolve_op(call) is torch.Tensor.exp
    for attempt in (rebuild_arguments, recompute):
        with pytest.raises(NotReplayable, match=r"input\.0 \(float32 \[3\]\) has no tensor data"):
            attempt(call)


def test_module_call_is_not_replayable(tmp_path: Path) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    dump, _ = capture_ops(model, tmp_path, torch.randn(1, 2), level="mix")
    modules = [call for call in dump.calls if call.kind == "Module"]
    assert modules
    for call in modules:
        with pytest.raises(NotReplayable, match="module's forward"):
            recompute(call)
    (linear,) = op_calls(dump).values()
    assert_bitwise_equal(recompute(linear, dtype=None)["output.0"], linear.outputs[0].load())


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("Torch.no_such_op.0.forward", "no Torch op 'no_such_op'"),
        ("Tensor.no_such_op.0.forward", "no Tensor op"),
        ("Functional.__class__.0.forward", "no Functional op"),
        ("Torch.os.system.0.forward", "no Torch op"),
        ("Torch.Tensor.0.forward", "no Torch op"),
        ("Aten.no_such_op.default.0.forward", "no Aten op"),
        ("Jit.foo.0.forward", "kind 'Jit' cannot be replayed"),
        ("Torch.randn.0.forward", "random op"),
        ("Tensor.normal_.0.forward", "random op"),
        ("Torch.multinomial.0.forward", "random op"),
        ("Aten.empty.memory_format.0.forward", "uninitialized"),
        ("Tensor.new_empty_strided.0.forward", "uninitialized"),
        ("Distributed.all_reduce.0.forward", "communication"),
        ("Torch.all_gather.0.forward", "communication"),
        ("Functional.linear.0.backward", "backward"),
    ],
)
def test_not_replayable_names(name: str, reason: str) -> None:
    call = make_call(name, {"input.0": torch.ones(2)})
    with pytest.raises(NotReplayable, match=reason) as excinfo:
        resolve_op(call)
    assert isinstance(excinfo.value, PrecisionError)
    assert "\n" not in str(excinfo.value)


def test_dropout_without_training_flag_is_random() -> None:
    """F.dropout trains by default: absent the flag, a rerun draws a new mask."""
    call = make_call("Functional.dropout.0.forward", {"input.0": torch.ones(2)})
    with pytest.raises(NotReplayable, match="training=True"):
        resolve_op(call)


def test_aten_and_overloads_resolve() -> None:
    a, b = torch.randn(3), torch.randn(3)
    call = make_call(
        "Aten.add.Tensor.0.forward",
        {"input.0": a, "input.1": b, "kwargs.alpha": 2, "output.0": a + 2 * b},
    )
    assert resolve_op(call) is torch.ops.aten.add.Tensor
    assert_bitwise_equal(recompute(call, dtype=None)["output.0"], a + 2 * b)
    packet = make_call("Aten.mm.0.forward", {})
    assert resolve_op(packet) is torch.ops.aten.mm


def test_rebuilt_arguments() -> None:
    a, b = torch.randn(2), torch.arange(2)
    call = make_call(
        "Torch.cat.0.forward",
        {
            "input.0.0": a,
            "input.0.1": b,
            "input.1": "torch.bfloat16",
            "input.2": [slice(1, None, 2), Ellipsis, None, "torch.channels_last"],
            "kwargs.dim": 0,
            "kwargs.named.first": a,
        },
    )
    args, kwargs = rebuild_arguments(call, convert=lambda t: t * 10)
    assert isinstance(args[0], tuple)
    assert len(args[0]) == 2
    assert torch.equal(args[0][0], a * 10)
    assert torch.equal(args[0][1], b * 10)
    assert args[1] is torch.bfloat16
    assert args[2] == [slice(1, None, 2), Ellipsis, None, torch.channels_last]
    assert kwargs["dim"] == 0
    assert torch.equal(kwargs["named"]["first"], a * 10)


@pytest.mark.parametrize(
    ("slots", "reason"),
    [
        ({"input.0": 1, "input.2": 2}, r"incomplete arguments: input\.1 is not in the dump"),
        ({"input.0.0": 1, "input.0.2": 2}, r"input\.0\.1 is not in the dump"),
        ({"input.0": 1, "input.0.1": 2}, "nests inside a value"),
        ({"input.0": 1, "input.x": 2}, r"input\.\* slots are not numbered"),
        ({"input": 1}, "slot input names no argument"),
    ],
)
def test_incomplete_slots(slots: dict[str, Any], reason: str) -> None:
    call = make_call("Torch.cat.0.forward", slots)
    with pytest.raises(NotReplayable, match=reason):
        rebuild_arguments(call)


def test_op_that_raises_is_not_replayable() -> None:
    call = make_call(
        "Torch.matmul.0.forward",
        {"input.0": torch.ones(2, 3), "input.1": torch.ones(2, 3)},
    )
    with pytest.raises(
        NotReplayable, match=r"Torch.matmul.0.forward raised when rerun: RuntimeError: mat1"
    ):
        recompute(call)


# -- NPU ops --------------------------------------------------------------------------------------


def _install_fake_torch_npu(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """A torch_npu whose npu_rms_norm a torch-function mode sees, like a real torch builtin."""

    def npu_rms_norm(x: torch.Tensor, gamma: torch.Tensor, epsilon: float = 1e-6) -> Any:
        if torch.overrides.has_torch_function((x, gamma)):
            return torch.overrides.handle_torch_function(
                npu_rms_norm, (x, gamma), x, gamma, epsilon=epsilon
            )
        rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + epsilon)
        return x * rstd * gamma, rstd

    fake = types.ModuleType("torch_npu")
    fake.npu_rms_norm = npu_rms_norm  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch_npu", fake)
    return fake


def test_npu_op_is_looked_up_at_call_time(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = _install_fake_torch_npu(monkeypatch)
    x, gamma = torch.randn(2, 8), torch.randn(8)
    dump, output = capture_ops(Lambda(lambda x, g: fake.npu_rms_norm(x, g)), tmp_path, x, gamma)
    (call,) = op_calls(dump).values()
    assert call.name == "Torch.npu_rms_norm.0.forward"
    reran = recompute(call, dtype=None)
    assert sorted(reran) == ["output.0", "output.1"]
    assert_bitwise_equal(reran["output.0"], output[0])

    seen: list[tuple[torch.Tensor, ...]] = []

    def patched(x: torch.Tensor, gamma: torch.Tensor, epsilon: float = 1e-6) -> Any:
        seen.append((x, gamma))
        return torch.full_like(x, 7.0), torch.zeros(2, 1, dtype=x.dtype)

    monkeypatch.setattr(fake, "npu_rms_norm", patched)  # after the capture, like a patch at import
    assert resolve_op(call) is patched
    reran = recompute(call)
    assert len(seen) == 1
    assert seen[0][0].dtype == torch.float64
    assert torch.equal(reran["output.0"], torch.full((2, 8), 7.0, dtype=torch.float64))

    msprobe_name = make_call("NPU.npu_rms_norm.0.forward", {})
    assert resolve_op(msprobe_name) is patched


def test_npu_op_without_torch_npu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch_npu", None)  # import torch_npu raises ImportError
    for name in ("NPU.npu_fusion_attention.0.forward", "Torch.npu_rms_norm.0.forward"):
        with pytest.raises(NotReplayable, match="needs torch_npu, which cannot be imported"):
            resolve_op(make_call(name, {}))
