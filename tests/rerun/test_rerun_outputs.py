"""Op reruns reproduce the recorded outputs from the dump alone: bitwise with the recorded
layouts, in float64 within rounding, from msprobe dumps, and for in-place ops."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from dump_helpers import MSPROBE_FIXTURES, assert_bitwise_equal
from rerun_helpers import Lambda, capture_ops, make_call, op_calls

from examples.tiny_llama import TinyLlamaConfig, build_tiny_llama, example_input_ids
from pytest_precision import PrecisionInputError, load_dump
from pytest_precision.dump import Dump
from pytest_precision.rerun._arguments import rebuild_arguments
from pytest_precision.rerun._ops import NotReplayable, resolve_op
from pytest_precision.rerun._recompute import Rerun, recompute

CONFIG = TinyLlamaConfig(num_layers=2)


@pytest.fixture(scope="module", params=[torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def llama_dump(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Dump:
    model = build_tiny_llama(CONFIG, seed=0, dtype=request.param)
    ids = example_input_ids(CONFIG, seq=8)
    dump, _ = capture_ops(model, tmp_path_factory.mktemp("llama"), ids)
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
    dump, output = capture_ops(
        Lambda(lambda q, k: torch.matmul(q, k.transpose(-1, -2))), tmp_path, q, k
    )
    call = op_calls(dump)["Torch.matmul.0.forward"]
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
    dump, _ = capture_ops(Lambda(lambda t: t.neg()), tmp_path, recorded)
    (call,) = op_calls(dump).values()
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
    dump, _ = capture_ops(
        Lambda(lambda s: F.softmax(s, dim=-1, dtype=torch.float32).to(torch.bfloat16)),
        tmp_path,
        scores,
    )
    softmax, cast = op_calls(dump).values()
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
    call = make_call("Torch.neg.0.forward", {"input.0": torch.ones(2)})
    with pytest.raises(PrecisionInputError, match="floating"):
        recompute(call, dtype=torch.int64)


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
    dump, output = capture_ops(Lambda(_add_one_in_place), tmp_path, x)
    calls = op_calls(dump)
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
    call = make_call("Tensor.__iadd__.0.forward", {"input.0": y, "input.1": 1.5})
    assert resolve_op(call) is torch.Tensor.__iadd__
    seen: list[torch.Tensor] = []
    loaded = call.inputs[0].loader
    assert loaded is not None
    object.__setattr__(call.inputs[0], "loader", lambda: seen.append(loaded()) or seen[-1])
    reran = recompute(call, dtype=None)["output.0"]
    assert_bitwise_equal(reran, y + 1.5)
    assert_bitwise_equal(seen[0], y)  # the loaded tensor was copied, not written to
