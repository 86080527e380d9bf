"""A tensor recorded anew is read once on the model's thread: its fingerprint comes from the
statistics pass or the private copy that reads it anyway. A tensor seen again is read once
more, to verify it is unchanged, and a stomp is still found by that read."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from dump_helpers import stomp

from pytest_precision import capture, tensor_stats
from pytest_precision.dump import _writer
from pytest_precision.dump._native import read_native_dump
from pytest_precision.dump._recorded import RecordedTensors
from pytest_precision.dump._records import RecordRef
from pytest_precision.numerics import _kernels
from pytest_precision.numerics._content import tensor_stats_and_content

needs_numba = pytest.mark.skipif(not _kernels.enabled(), reason="the numba kernels are off")

#: What a pass over a tensor's memory starts with: the kernels read a tensor through a numpy
#: view of it, torch through a reduction or a copy.
_PASSES = ("numpy", "sum", "clone")


def _passes(monkeypatch: pytest.MonkeyPatch) -> Counter[int]:
    """Passes begun over each memory address from now on."""
    counted: Counter[int] = Counter()
    for name in _PASSES:
        original = getattr(torch.Tensor, name)

        def spy(self: torch.Tensor, *args: Any, _o: Any = original, **kwargs: Any) -> Any:
            counted[self.data_ptr()] += 1
            return _o(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, spy)
    return counted


class _Chain(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        z = torch.tanh(y)  # y seen again
        out = z + y  # z and y seen again
        self.seen = (y, z, out)  # kept alive: their addresses stay theirs
        return out


@needs_numba
@pytest.mark.parametrize("mode", ["statistics", "tensor"])
def test_each_new_tensor_is_read_once_and_once_more_when_seen_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    x, model = torch.randn(64, 48), _Chain()
    _writer._summarizable(x.dtype)  # its probe's passes, before counting
    counted = _passes(monkeypatch)
    with torch.no_grad(), capture(model, tmp_path, level="op", mode=mode):  # type: ignore[arg-type]
        model(x)
    y, z, out = model.seen
    # x, out: recorded once; z: recorded, then verified once; y: recorded, verified twice
    reads = [counted[t.data_ptr()] for t in (x, y, z, out)]
    assert reads == [1, 3, 2, 1]


def test_the_fingerprint_the_statistics_pass_made_finds_a_stomp() -> None:
    recorded = RecordedTensors(lambda key: None, any_shape=True)
    t = torch.randn(1000)
    stats, content = tensor_stats_and_content(t)
    assert stats == tensor_stats(t)
    recorded.remember(t, "0", "producer", content)
    assert recorded.key_of(t.view(10, 100)) == "0"
    stomp(t, count=1)
    assert recorded.key_of(t) is None
    assert recorded.changed_since == "producer"


def test_a_view_where_a_large_parameter_lies_is_checked_by_the_parameters_rule() -> None:
    """A parameter's fingerprint samples it; a plain view of it with its geometry is checked
    by the same sample, not by a whole content sum that could never match it."""
    recorded = RecordedTensors(lambda key: None)
    weight = torch.nn.Parameter(torch.randn(256, 1024), requires_grad=False)
    recorded.remember(weight, "0", "parameters.weight")
    view = weight.view(weight.shape)
    assert not isinstance(view, torch.nn.Parameter)
    assert recorded.key_of(view) == "0"
    assert recorded.changed_since is None
    stomp(weight.detach().view(-1), count=3)
    assert recorded.key_of(view) is None
    assert recorded.changed_since == "parameters.weight"


class _StompsWhatItRead(torch.nn.Module):
    def __init__(self, read_first: bool) -> None:
        super().__init__()
        self.read_first = read_first

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.exp()
        if self.read_first:  # a consumer verifies y before the stomp
            self.total = y.view(-1).sum()
        stomp(y, value=7.0, count=5)
        return y.sqrt()


@pytest.mark.parametrize("read_first", [False, True])
@pytest.mark.parametrize("kernels", ["numba", "torch"])
@pytest.mark.parametrize("mode", ["statistics", "tensor"])
def test_a_stomp_is_found_whichever_pass_made_the_fingerprint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str, kernels: str, read_first: bool
) -> None:
    if kernels == "numba" and not _kernels.enabled():
        pytest.skip("the numba kernels are off")
    if kernels == "torch":
        monkeypatch.setenv(_kernels.ENV_SWITCH, "0")
    model = _StompsWhatItRead(read_first)
    with torch.no_grad(), capture(model, tmp_path, level="op", mode=mode):  # type: ignore[arg-type]
        model(torch.linspace(0, 1, 300))
    records = {r.key: r for r in read_native_dump(tmp_path)}
    stomped = [r.key for r in records.values() if r.changed_since]
    assert stomped == ["Tensor.sqrt.0.forward.input.0"]
    assert records["Tensor.sqrt.0.forward.input.0"].changed_since == RecordRef(
        "Tensor.exp.0.forward", "output.0", 0
    )


class _Views(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        flat = y.view(-1)  # y verified as the view's input; the output is y again
        out = flat.neg()  # y verified again: code ran since the view
        self.seen = (y, out)
        return out


@needs_numba
def test_a_view_is_not_verified_again_in_the_call_that_made_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    x, model = torch.randn(64, 48), _Views()
    _writer._summarizable(x.dtype)
    counted = _passes(monkeypatch)
    with torch.no_grad(), capture(model, tmp_path, level="op", mode="statistics"):
        model(x)
    y, out = model.seen
    # y: recorded once, verified as the view's input and as neg's, not as the view's output
    assert [counted[t.data_ptr()] for t in (x, y, out)] == [1, 3, 1]


def test_the_read_that_records_a_tensor_sums_its_bits_only_where_they_are_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A large parameter's fingerprint samples it and an inference tensor is never reused:
    their statistics pass leaves the content sum out."""
    from pytest_precision.dump import _capture

    asked: dict[str, bool] = {}
    summarize = _capture.summarize

    def noting(t: torch.Tensor, content: bool = True) -> tuple[Any, int | None]:
        kind = "parameter" if isinstance(t, torch.nn.Parameter) else "activation"
        kind = f"large {kind}" if t.numel() > 1 << 16 else kind
        asked[kind] = asked.get(kind, False) or content
        return summarize(t, content)

    monkeypatch.setattr(_capture, "summarize", noting)
    model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.Linear(512, 4))
    with torch.no_grad(), capture(model, tmp_path / "g", level="op", mode="statistics"):
        model(torch.randn(2, 512))
    assert asked == {"large parameter": False, "parameter": True, "activation": True}
    asked.clear()
    with torch.inference_mode(), capture(model, tmp_path / "i", level="op", mode="statistics"):
        model(torch.randn(2, 512))
    assert not asked["activation"]
    records = {r.key: r for r in read_native_dump(tmp_path / "g")}
    weight = records["Functional.linear.0.forward.input.1"]
    assert weight.stats == tensor_stats(model[0].weight)


def test_the_module_hooks_own_torch_calls_bypass_the_op_mode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At the mix level a module's hooks record with the op mode active: their own torch calls
    (a view, a sum) must not each take a Python round trip through it (2,000 per forward of
    the HF Llama did). The mode sees the model's calls, as many as at the op level."""
    from pytest_precision.dump import _capture

    seen: Counter[str] = Counter()
    level = "op"
    through = _capture._OpMode.__torch_function__

    def counting(self: Any, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        seen[level] += 1
        return through(self, func, types, args, kwargs)

    monkeypatch.setattr(_capture._OpMode, "__torch_function__", counting)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    for level in ("op", "mix"):
        with torch.no_grad(), capture(model, tmp_path / level, level=level):  # type: ignore[arg-type]
            model(torch.randn(3, 16))
    assert seen["op"] > 0
    assert seen["mix"] == seen["op"]
