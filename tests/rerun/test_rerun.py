"""Op replay: recorded calls resolve to their torch callables and rerun from the dump alone."""

from __future__ import annotations

import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from dump_helpers import MSPROBE_FIXTURES, assert_bitwise_equal

from examples.tiny_llama import TinyLlamaConfig, build_tiny_llama, example_input_ids
from pytest_precision import PrecisionError, PrecisionInputError, capture, load_dump
from pytest_precision.dump import Dump
from pytest_precision.dump._msprobe import _parse_name
from pytest_precision.dump._records import Call, Record
from pytest_precision.numerics._dtypes import dtype_name
from pytest_precision.rerun._arguments import rebuild_arguments
from pytest_precision.rerun._ops import NotReplayable, resolve_op
from pytest_precision.rerun._recompute import Rerun, recompute

CONFIG = TinyLlamaConfig(num_layers=2)


def _capture(
    model: torch.nn.Module, path: Path, *inputs: torch.Tensor, **options: Any
) -> tuple[Dump, Any]:
    options = {"level": "op", "mode": "tensor", **options}
    with torch.no_grad(), capture(model, path, **options):
        output = model(*inputs)
    return load_dump(path), output


def _ops(dump: Dump) -> dict[str, Call]:
    return {call.name: call for call in dump.calls if call.kind != "Module"}


def _call(name: str, values: dict[str, Any]) -> Call:
    """A call built by hand, as a reader would give it: tensors are loaded fresh each time."""
    kind, op, _ = _parse_name(name)

    def record(slot: str, value: Any) -> Record:
        if not isinstance(value, torch.Tensor):
            return Record(name=name, slot=slot, kind=kind, op=op, value=value)
        stored = value.clone()
        return Record(
            name=name,
            slot=slot,
            kind=kind,
            op=op,
            dtype=dtype_name(stored.dtype),
            shape=tuple(stored.shape),
            loader=stored.clone,
        )

    records = tuple(record(slot, value) for slot, value in values.items())
    return Call(name, kind, op, None, 0, 0, records)


@pytest.fixture(scope="module", params=[torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def llama_dump(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Dump:
    model = build_tiny_llama(CONFIG, seed=0, dtype=request.param)
    ids = example_input_ids(CONFIG, seq=8)
    dump, _ = _capture(model, tmp_path_factory.mktemp("llama"), ids)
    return dump


# -- 1. reruns reproduce the recorded outputs ----------------------------------------------------


def test_every_llama_op_reruns_bitwise(llama_dump: Dump) -> None:
    refused: dict[str, str] = {}
    compared = 0
    for call in llama_dump.calls:
        try:
            outputs = recompute(call, dtype=None)
        except NotReplayable as exc:
            refused[call.name] = str(exc)
            continue
        recorded = [r for r in call.outputs if r.is_tensor]
        assert sorted(outputs) == sorted(r.slot for r in recorded), call.name
        for record in recorded:
            assert_bitwise_equal(outputs[record.slot], record.load())
            compared += 1
    assert refused == {}
    assert len(llama_dump.calls) > 140
    assert compared >= len(llama_dump.calls)
    # The transposed operand of the attention matmul was recorded with its strides: without
    # them the rerun may take another kernel path (see test_layout_is_restored).
    kinds = {call.name.rsplit(".", 2)[0] for call in llama_dump.calls}
    assert {
        "Functional.linear",
        "Torch.matmul",
        "Functional.softmax",
        "Tensor.__getitem__",
    } <= kinds


def test_layout_is_restored(tmp_path: Path) -> None:
    q, k = torch.randn(1, 4, 8, 16), torch.randn(1, 4, 8, 16)
    dump, output = _capture(
        _Lambda(lambda q, k: torch.matmul(q, k.transpose(-1, -2))), tmp_path, q, k
    )
    call = _ops(dump)["Torch.matmul.0.forward"]
    assert call.inputs[0].stride is None  # contiguous: nothing to restore
    assert call.inputs[1].stride == (512, 128, 1, 16)
    (_, rebuilt_k), _ = rebuild_arguments(call)
    assert rebuilt_k.stride() == k.transpose(-1, -2).stride()
    assert torch.equal(rebuilt_k, k.transpose(-1, -2))
    # Rerun on the machine that recorded, in the same test: the same kernel path, the same bits
    # (a contiguous copy may take another path on some CPUs and differ in the last bits).
    assert_bitwise_equal(recompute(call, dtype=None)["output.0"], output)


#: views -> the strides replay lays their recorded data out with: the recorded dimension order,
#: broadcast dimensions expanded again, gaps (of a strided slice) closed
LAYOUTS = [
    (lambda x: x.transpose(0, 2), (1, 4, 12)),
    (lambda x: x[:, :, 0].unsqueeze(1).expand(2, 4, 3), (3, 0, 1)),
    (lambda x: x.permute(1, 2, 0)[::2], (4, 1, 8)),
    (lambda x: x[0].unsqueeze(0).expand(5, 3, 4).transpose(-1, -2), (0, 1, 4)),
]


@pytest.mark.parametrize(("view", "rebuilt_stride"), LAYOUTS)
def test_rebuilt_tensors_keep_the_recorded_layout(
    tmp_path: Path, view: Callable[[torch.Tensor], torch.Tensor], rebuilt_stride: tuple[int, ...]
) -> None:
    recorded = view(torch.randn(2, 3, 4))
    dump, _ = _capture(_Lambda(lambda t: t.neg()), tmp_path, recorded)
    (call,) = _ops(dump).values()
    assert call.inputs[0].stride == recorded.stride()
    (rebuilt,), _ = rebuild_arguments(call)
    assert rebuilt.stride() == rebuilt_stride
    assert_bitwise_equal(rebuilt, recorded)


# -- 2. float64 reruns ----------------------------------------------------------------------------


def test_float64_rerun_is_close_and_float64(llama_dump: Dump) -> None:
    bf16 = any(r.dtype == "bfloat16" for r in llama_dump)
    tolerance = {"rtol": 2e-2, "atol": 2e-2} if bf16 else {"rtol": 1e-4, "atol": 1e-5}
    changed = 0
    for call in llama_dump.calls:
        outputs = recompute(call)
        for record in call.outputs:
            recorded = record.load()
            assert recorded is not None
            rerun = outputs[record.slot]
            if recorded.is_floating_point():
                assert rerun.dtype == torch.float64, call.name
                torch.testing.assert_close(rerun, recorded.double(), **tolerance, msg=call.name)
                changed += not torch.equal(rerun, recorded.double())
            else:  # integer and bool results keep their dtype and are exact
                assert_bitwise_equal(rerun, recorded)
    assert changed > 20  # the reruns did compute in float64, not pass the recorded data on


def test_softmax_dtype_argument_runs_in_float64(tmp_path: Path) -> None:
    scores = torch.randn(2, 3, 7)
    dump, _ = _capture(
        _Lambda(lambda s: F.softmax(s, dim=-1, dtype=torch.float32).to(torch.bfloat16)),
        tmp_path,
        scores,
    )
    softmax, cast = _ops(dump).values()
    assert softmax.name == "Functional.softmax.0.forward"
    _, kwargs = rebuild_arguments(softmax)
    assert kwargs["dtype"] is torch.float32  # recorded as the string "torch.float32"

    rerun = recompute(softmax)["output.0"]
    exact = scores.double().exp() / scores.double().exp().sum(-1, keepdim=True)
    assert rerun.dtype == torch.float64
    assert (rerun - exact).abs().max() < 1e-15
    recorded = softmax.outputs[0].load()
    assert recorded is not None
    assert (recorded.double() - exact).abs().max() > 1e-9

    # .to(torch.bfloat16) at float64 is a float64 identity: no rounding to bfloat16 left
    cast_input = cast.inputs[0].load()
    assert cast_input is not None
    assert_bitwise_equal(recompute(cast)["output.0"], cast_input.double())
    assert recompute(cast, dtype=None)["output.0"].dtype == torch.bfloat16


def test_recompute_refuses_a_non_floating_dtype() -> None:
    call = _call("Torch.neg.0.forward", {"input.0": torch.ones(2)})
    with pytest.raises(PrecisionInputError, match="floating"):
        recompute(call, dtype=torch.int64)


# -- 3. what cannot be replayed -------------------------------------------------------------------


class _Lambda(torch.nn.Module):
    def __init__(self, forward: Callable[..., Any]) -> None:
        super().__init__()
        self.function = forward

    def forward(self, *args: Any) -> Any:
        return self.function(*args)


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
    dump, _ = _capture(_Lambda(_assorted), tmp_path, x)
    calls = _ops(dump)
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
    dump, _ = _capture(_Lambda(lambda x: x.exp()), tmp_path, torch.randn(3), mode="statistics")
    (call,) = _ops(dump).values()
    assert resolve_op(call) is torch.Tensor.exp
    for attempt in (rebuild_arguments, recompute):
        with pytest.raises(NotReplayable, match=r"input\.0 \(float32 \[3\]\) has no tensor data"):
            attempt(call)


def test_module_call_is_not_replayable(tmp_path: Path) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    dump, _ = _capture(model, tmp_path, torch.randn(1, 2), level="mix")
    modules = [call for call in dump.calls if call.kind == "Module"]
    assert modules
    for call in modules:
        with pytest.raises(NotReplayable, match="module's forward"):
            recompute(call)
    (linear,) = _ops(dump).values()
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
    call = _call(name, {"input.0": torch.ones(2)})
    with pytest.raises(NotReplayable, match=reason) as excinfo:
        resolve_op(call)
    assert isinstance(excinfo.value, PrecisionError)
    assert "\n" not in str(excinfo.value)


def test_dropout_without_training_flag_is_random() -> None:
    """F.dropout trains by default: absent the flag, a rerun draws a new mask."""
    call = _call("Functional.dropout.0.forward", {"input.0": torch.ones(2)})
    with pytest.raises(NotReplayable, match="training=True"):
        resolve_op(call)


def test_aten_and_overloads_resolve() -> None:
    a, b = torch.randn(3), torch.randn(3)
    call = _call(
        "Aten.add.Tensor.0.forward",
        {"input.0": a, "input.1": b, "kwargs.alpha": 2, "output.0": a + 2 * b},
    )
    assert resolve_op(call) is torch.ops.aten.add.Tensor
    assert_bitwise_equal(recompute(call, dtype=None)["output.0"], a + 2 * b)
    packet = _call("Aten.mm.0.forward", {})
    assert resolve_op(packet) is torch.ops.aten.mm


def test_rebuilt_arguments() -> None:
    a, b = torch.randn(2), torch.arange(2)
    call = _call(
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
    call = _call("Torch.cat.0.forward", slots)
    with pytest.raises(NotReplayable, match=reason):
        rebuild_arguments(call)


def test_op_that_raises_is_not_replayable() -> None:
    call = _call(
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
    dump, output = _capture(_Lambda(lambda x, g: fake.npu_rms_norm(x, g)), tmp_path, x, gamma)
    (call,) = _ops(dump).values()
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

    msprobe_name = _call("NPU.npu_rms_norm.0.forward", {})
    assert resolve_op(msprobe_name) is patched


def test_npu_op_without_torch_npu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch_npu", None)  # import torch_npu raises ImportError
    for name in ("NPU.npu_fusion_attention.0.forward", "Torch.npu_rms_norm.0.forward"):
        with pytest.raises(NotReplayable, match="needs torch_npu, which cannot be imported"):
            resolve_op(_call(name, {}))


# -- 4. msprobe dumps ------------------------------------------------------------------------------

MSPROBE_CALLABLES = {
    "Functional.linear": F.linear,
    "Functional.gelu": F.gelu,
    "Functional.softmax": F.softmax,
    "Torch.matmul": torch.matmul,
    "Tensor.__matmul__": torch.Tensor.__matmul__,
}


@pytest.mark.parametrize("case", ["l1_tensor_ranks", "mix_tensor_steps"])
def test_msprobe_tensor_dumps_replay(case: str) -> None:
    dump = load_dump(MSPROBE_FIXTURES / case)
    replayed = 0
    for call in dump.calls:
        if call.kind == "Module":
            with pytest.raises(NotReplayable, match="module's forward"):
                resolve_op(call)
            continue
        assert resolve_op(call) is MSPROBE_CALLABLES[call.name.rsplit(".", 2)[0]]
        outputs = recompute(call, dtype=None)
        (record,) = call.outputs
        recorded = record.load()
        assert recorded is not None
        # Recorded on another machine (another CPU's kernels): within rounding, not bitwise.
        rerun = Rerun(call)
        assert outputs[record.slot].dtype == recorded.dtype
        for value in (recorded, outputs[record.slot]):
            judged = rerun.judge(record.slot, value)
            assert judged is not None
            assert judged.verdict == "pass", (call.name, judged.reason)
        in_float64 = recompute(call)[record.slot]
        assert in_float64.dtype == torch.float64
        tolerance = 1e-2 if recorded.dtype == torch.bfloat16 else 1e-5
        torch.testing.assert_close(in_float64, recorded.double(), rtol=tolerance, atol=tolerance)
        replayed += 1
    assert replayed >= 7


@pytest.mark.parametrize("case", ["mix_statistics", "l1_md5"])
def test_msprobe_statistics_dumps_name_the_missing_data(case: str) -> None:
    dump = load_dump(MSPROBE_FIXTURES / case)
    ops = [call for call in dump.calls if call.kind != "Module"]
    assert ops
    for call in ops:
        resolve_op(call)
        with pytest.raises(NotReplayable, match="has no tensor data: the dump holds statistics"):
            recompute(call)


# -- 5. in-place ops -------------------------------------------------------------------------------


def _add_one_in_place(x: torch.Tensor) -> torch.Tensor:
    y = x * 2
    y.add_(1)
    y += 1
    return y


def test_inplace_op_gives_the_post_op_value_and_leaves_inputs_alone(tmp_path: Path) -> None:
    x = torch.randn(5)
    dump, output = _capture(_Lambda(_add_one_in_place), tmp_path, x)
    calls = _ops(dump)
    add_, iadd = calls["Tensor.add_.0.forward"], calls["Tensor.add_.1.forward"]  # y += 1
    before = add_.inputs[0].load()
    assert before is not None
    assert torch.equal(before, x * 2)

    for call, expected in ((add_, x * 2 + 1), (iadd, output)):
        reran = recompute(call, dtype=None)["output.0"]
        assert_bitwise_equal(reran, expected)
        assert_bitwise_equal(reran, call.outputs[0].load())
        torch.testing.assert_close(recompute(call)["output.0"], expected.double())
    assert_bitwise_equal(add_.inputs[0].load(), before)  # the dump's input is untouched


def test_inplace_dunder_reruns_on_a_copy() -> None:
    """msprobe names ``y += 1`` ``Tensor.__iadd__``; it writes into its first argument."""
    y = torch.randn(4)
    call = _call("Tensor.__iadd__.0.forward", {"input.0": y, "input.1": 1.5})
    assert resolve_op(call) is torch.Tensor.__iadd__
    seen: list[torch.Tensor] = []
    loaded = call.inputs[0].loader
    assert loaded is not None
    object.__setattr__(call.inputs[0], "loader", lambda: seen.append(loaded()) or seen[-1])
    reran = recompute(call, dtype=None)["output.0"]
    assert_bitwise_equal(reran, y + 1.5)
    assert_bitwise_equal(seen[0], y)  # the loaded tensor was copied, not written to
