"""replay_op verdicts (noise / context / op-bug) and the ``replay`` CLI, on real captures of the
tiny Llama: clean, with a kernel bug baked into the recorded output, and with a kernel patched
at replay time."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from replay_helpers import BrokenOp, capture_llama

from pytest_precision import (
    PrecisionInputError,
    ReplayResult,
    TensorComparison,
    load_dump,
    replay_op,
)
from pytest_precision.cli import main
from pytest_precision.dump._extract import write_calls
from pytest_precision.report import render
from pytest_precision.rerun._ops import NotReplayable
from pytest_precision.rerun._recompute import find_call

SOFTMAX_1 = "Functional.softmax.1.forward"  # layer 1's attention probabilities
SILU_0 = "Functional.silu.0.forward"


@pytest.fixture(scope="module")
def dumps(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """Captures of the tiny Llama, made once per module: ``clean``, ``bf16``, ``context`` (the
    second softmax kernel returned skewed probabilities while recording), ``statistics``."""
    made: dict[str, Path] = {}
    options = {
        "clean": {},
        "bf16": {"dtype": torch.bfloat16},
        "context": {"broken": BrokenOp(F.softmax, 2)},
        "statistics": {"mode": "statistics"},
        "steps": {"steps": 2, "level": "op"},
    }

    def get(variant: str) -> Path:
        if variant not in made:
            path = tmp_path_factory.mktemp(variant) / "dump"
            made[variant] = capture_llama(path, **options[variant])  # type: ignore[arg-type]
        return made[variant]

    return get


def _broken_silu(x: torch.Tensor, inplace: bool = False) -> torch.Tensor:
    """A kernel bug of the low-precision path, as a device library patches it in: one percent
    off, far outside float32 rounding; float64 (the reference) takes the right path."""
    right = x * torch.sigmoid(x)
    return right if x.dtype == torch.float64 else right * 1.01


# -- verdicts ------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", ["clean", "bf16"])
def test_every_op_of_a_clean_dump_is_noise(dumps: Callable[[str], Path], variant: str) -> None:
    dump = load_dump(dumps(variant))
    ops = [call for call in dump.calls if call.kind != "Module"]
    verdicts = {call.name: replay_op(dump, call.name).verdict for call in ops}
    assert len(verdicts) == len(ops) > 140
    assert set(verdicts.values()) == {"noise"}


def test_a_wrong_recorded_output_of_a_right_op_is_context(dumps: Callable[[str], Path]) -> None:
    result = replay_op(dumps("context"), SOFTMAX_1)
    assert result.verdict == "context"
    assert result.passed
    (slot,) = result.slots
    assert (slot.slot, slot.verdict) == ("output.0", "context")
    assert slot.recorded.verdict == "fail"
    assert slot.rerun.verdict == "pass"
    assert slot.golden is None
    assert "the op is right" in result.reason
    # the call before it, and the one after it on the same data path, are fine
    assert replay_op(dumps("context"), "Functional.softmax.0.forward").verdict == "noise"
    assert replay_op(dumps("context"), "Torch.matmul.3.forward").verdict == "noise"


def test_an_op_that_computes_wrong_alone_is_an_op_bug(
    dumps: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    clean = dumps("clean")  # captured before the op breaks
    monkeypatch.setattr(F, "silu", _broken_silu)  # resolved by name at replay time
    result = replay_op(clean, SILU_0)
    assert result.verdict == "op-bug"
    assert not result.passed
    (slot,) = result.slots
    assert slot.recorded.verdict == "pass"  # the dump was made with the right kernel
    assert slot.rerun.verdict == "fail"
    assert "computes wrong by itself" in result.reason
    # an op the patch does not touch is still noise
    assert replay_op(dumps("clean"), SOFTMAX_1).verdict == "noise"


def test_an_op_bug_outranks_context(
    dumps: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken_softmax(x: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        right = torch.softmax(x, -1)
        return right if x.dtype == torch.float64 else right * 1.01

    context = dumps("context")  # captured before the op breaks
    monkeypatch.setattr(F, "softmax", broken_softmax)
    assert replay_op(context, SOFTMAX_1).verdict == "op-bug"


def test_the_report(dumps: Callable[[str], Path]) -> None:
    result = replay_op(dumps("context"), SOFTMAX_1, golden=dumps("clean"))
    assert isinstance(result, ReplayResult)
    assert result.verdict == "context"
    assert result.golden == str(dumps("clean"))
    (slot,) = result.slots
    assert isinstance(slot.golden, TensorComparison)
    assert slot.golden.verdict == "pass"  # the clean run's softmax is right
    assert slot.golden.max_abs_err == pytest.approx(slot.rerun.max_abs_err, rel=1, abs=1e-6)
    lines = render(result).splitlines()
    assert lines[0] == f"replay {SOFTMAX_1} (step 0, rank 0) on cpu: context"
    assert lines[1].split() == [
        "module:",
        "model.layers.1.self_attn",
        "layer:",
        "model.layers.1",
    ]
    assert lines[3].startswith("  reason:  the op rerun alone on cpu is within float32 rounding")
    assert lines[5] == "  output.0: context"
    assert lines[6].startswith("    recorded: fail, cosine ")
    assert lines[7].startswith("    rerun on cpu: pass, cosine ")
    assert lines[8].startswith("    golden: pass, cosine ")
    assert 8 <= len(lines) <= 15


def test_a_golden_without_the_call(dumps: Callable[[str], Path], tmp_path: Path) -> None:
    only_silu = tmp_path / "golden"
    write_calls([find_call(load_dump(dumps("clean")), SILU_0)], only_silu, info={})
    assert replay_op(dumps("clean"), SILU_0, golden=only_silu).slots[0].golden is not None
    with pytest.raises(PrecisionInputError, match=rf"golden: no call named '{SOFTMAX_1}'"):
        replay_op(dumps("clean"), SOFTMAX_1, golden=only_silu)


# -- choosing the call and the device ------------------------------------------------------------


def test_unknown_names_suggest_close_ones(dumps: Callable[[str], Path]) -> None:
    with pytest.raises(PrecisionInputError) as raised:
        replay_op(dumps("clean"), "Functional.softmax.1.foward")
    message = str(raised.value)
    assert "no call named 'Functional.softmax.1.foward'" in message
    assert "close names: Functional.softmax.1.forward" in message


def test_a_module_call_needs_an_op_level_capture(dumps: Callable[[str], Path]) -> None:
    with pytest.raises(NotReplayable, match=r"capture at level='op' or 'mix'"):
        replay_op(dumps("clean"), "Module.model.layers.0.mlp.MLP.forward.0")


def test_a_statistics_dump_needs_tensor_mode(dumps: Callable[[str], Path]) -> None:
    with pytest.raises(NotReplayable, match=r"statistics only.*capture mode='tensor'"):
        replay_op(dumps("statistics"), SILU_0)


@pytest.mark.parametrize(
    ("device", "message"),
    [
        ("cuda", r"device 'cuda' is not available: this torch build .* has no CUDA support"),
        ("cuda:1", r"device 'cuda:1' is not available"),
        ("npu", r"device 'npu' is not available: torch_npu is not installed"),
        ("tpu", r"unknown device 'tpu'; known devices: cpu, cuda, npu"),
        ("cuda:x", r"not a device: 'cuda:x'"),
    ],
)
def test_unavailable_devices_are_refused_with_the_reason(
    dumps: Callable[[str], Path], device: str, message: str
) -> None:
    if torch.cuda.is_available() and device.startswith("cuda"):
        pytest.skip("CUDA is available here")
    with pytest.raises(PrecisionInputError, match=message):
        replay_op(dumps("clean"), SILU_0, device)


def test_a_recurring_name_needs_its_step(dumps: Callable[[str], Path]) -> None:
    dump = load_dump(dumps("steps"))
    with pytest.raises(PrecisionInputError, match=r"recorded 2 times \(step 0 rank 0, step 1"):
        replay_op(dump, SILU_0)
    assert find_call(dump, SILU_0, step=1).step == 1
    result = replay_op(dump, SILU_0, step=1, rank=0)
    assert (result.step, result.verdict) == (1, "noise")
    with pytest.raises(PrecisionInputError, match=r"not at step 2 rank None"):
        replay_op(dump, SILU_0, step=2)


# -- the CLI -------------------------------------------------------------------------------------


def _cli(capsys: pytest.CaptureFixture[str], *args: object) -> tuple[int, str, str]:
    code = main(["replay", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_noise_and_context_exit_0(
    dumps: Callable[[str], Path], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _cli(capsys, dumps("clean"), SILU_0)
    assert (code, err) == (0, "")
    assert out.startswith(f"replay {SILU_0} (step 0, rank 0) on cpu: noise\n")
    code, out, _ = _cli(
        capsys, dumps("context"), SOFTMAX_1, "--device", "cpu", "--golden", dumps("clean")
    )
    assert code == 0
    assert "on cpu: context\n" in out
    assert "    golden: pass" in out


def test_cli_op_bug_exits_1(
    dumps: Callable[[str], Path],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    steps = dumps("steps")  # captured before the op breaks
    monkeypatch.setattr(F, "silu", _broken_silu)
    code, out, _ = _cli(capsys, steps, SILU_0, "--step", "1", "--rank", "0")
    assert code == 1
    assert out.startswith(f"replay {SILU_0} (step 1, rank 0) on cpu: op-bug\n")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([SOFTMAX_1, "--device", "cuda"], "device 'cuda' is not available"),
        (["Functional.nope.0.forward"], "no call named 'Functional.nope.0.forward'"),
        (["Module.model.LlamaModel.forward.0"], "is a module's forward, not an op"),
    ],
)
def test_cli_errors_exit_2(
    dumps: Callable[[str], Path],
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    message: str,
) -> None:
    if torch.cuda.is_available() and "cuda" in args:
        pytest.skip("CUDA is available here")
    code, out, err = _cli(capsys, dumps("clean"), *args)
    assert (code, out) == (2, "")
    assert err.startswith("pytest-precision replay: error: ")
    assert message in err
    assert "Traceback" not in err


# -- ops beyond the tiny Llama (what review found) ------------------------------------------------


class _Everyday(torch.nn.Module):
    """Ops of real LLM code that a float64 reference alone would misjudge."""

    def forward(self, x: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
        picked = x.gather(-1, ids)  # logprob extraction: not a collective
        above = x > 0.1  # compares with 0.1 rounded to bf16, not with 0.1 itself
        big = x.to(torch.float16) * 40000.0  # overflows float16: +-inf is the right answer
        turned = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2)) * 1j
        return picked, above, big, turned


@pytest.fixture(scope="module")
def everyday(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from pytest_precision import capture

    path = tmp_path_factory.mktemp("everyday") / "dump"
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4, 16, generator=gen) * 3
    x[0, :4] = 0.1  # bf16 rounds it up to 0.10009765625: above 0.1, not above bf16(0.1)
    x = x.bfloat16()
    ids = torch.randint(0, 16, (4, 2), generator=gen)
    with torch.no_grad(), capture(_Everyday(), path, level="op") as cap:
        cap.model(x, ids)
    return path


@pytest.mark.parametrize(
    "name",
    [
        "Tensor.gather.0.forward",
        "Tensor.gt.0.forward",
        "Tensor.mul.0.forward",
        "Tensor.mul.1.forward",
    ],
)
def test_everyday_ops_of_a_clean_capture_are_noise(everyday: Path, name: str) -> None:
    names = {c.name for c in load_dump(everyday).calls}
    assert name in names, sorted(names)
    result = replay_op(everyday, name)
    assert result.verdict == "noise", render(result)


def test_an_overflow_of_the_output_dtype_is_said(everyday: Path) -> None:
    result = replay_op(everyday, "Tensor.mul.0.forward")
    assert "overflows float16" in result.reason


def test_an_op_recorded_under_autocast_is_not_rerun_as_another_kernel(tmp_path: Path) -> None:
    from pytest_precision import capture

    linear = torch.nn.Linear(8, 8)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16)
    with torch.no_grad(), capture(linear, tmp_path / "d", level="op") as cap, autocast:
        cap.model(torch.randn(2, 8))
    with pytest.raises(NotReplayable, match=r"ran under torch\.autocast"):
        replay_op(tmp_path / "d", "Functional.linear.0.forward")


def test_attention_with_dropout_is_random(tmp_path: Path) -> None:
    from pytest_precision import capture

    class Attention(torch.nn.Module):
        def forward(self, q: torch.Tensor) -> torch.Tensor:
            return F.scaled_dot_product_attention(q, q, q, dropout_p=0.1)

    with torch.no_grad(), capture(Attention(), tmp_path / "d", level="op") as cap:
        cap.model(torch.randn(1, 2, 4, 8))
    with pytest.raises(NotReplayable, match="dropout_p > 0"):
        replay_op(tmp_path / "d", "Functional.scaled_dot_product_attention.0.forward")


def test_a_failing_golden_under_a_noise_verdict_is_explained(
    dumps: Callable[[str], Path],
) -> None:
    """'golden: fail' under an overall 'noise' once read as a contradiction (#14)."""
    result = replay_op(dumps("clean"), SOFTMAX_1, golden=dumps("context"))
    assert result.verdict == "noise"
    assert result.slots[0].golden is not None
    assert result.slots[0].golden.verdict == "fail"
    text = render(result)
    assert "reported only, not part of the verdict" in text
    assert "The verdict, noise, judges the target's recorded output" in text


def test_export_test_refuses_a_missing_folder(dumps: Callable[[str], Path], tmp_path: Path) -> None:
    """-o /missing/dir/t.py once created the folder elsewhere; now nothing is created (#14)."""
    target = tmp_path / "missing" / "dir" / "t.py"
    assert main(["export-test", str(dumps("clean")), SOFTMAX_1, "-o", str(target)]) == 2
    assert not (tmp_path / "missing").exists()
