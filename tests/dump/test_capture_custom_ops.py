"""Ops called through ``torch.ops``: aten overloads and registered custom ops (vLLM's ``_C.*``
kernels are such ops) are recorded by name, and custom ones are refused by replay by name."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pytest_precision import capture, load_dump
from pytest_precision.rerun._ops import NotReplayable, resolve_op


@torch.library.custom_op("pp_capture_test::scaled_mm", mutates_args=())
def _scaled_mm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return 2.0 * (x @ w.T)


@torch.library.custom_op("pp_capture_test::fill_out", mutates_args=("out",))
def _fill_out(out: torch.Tensor, x: torch.Tensor) -> None:
    out.copy_(x + 1.0)  # like vLLM's _C kernels: fills a buffer, returns nothing


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(3, 4, generator=torch.Generator().manual_seed(0)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.ops.pp_capture_test.scaled_mm(x, self.w)
        out = torch.zeros_like(y)
        torch.ops.pp_capture_test.fill_out(out, y)
        return torch.ops.aten.add.Tensor(out, 1.0)


def test_custom_and_aten_ops_are_recorded_by_name(tmp_path: Path) -> None:
    net = _Net()
    x = torch.randn(2, 4, generator=torch.Generator().manual_seed(1))
    with capture(net, tmp_path / "d", level="mix"):
        out = net(x)
    calls = {c.name: c for c in load_dump(tmp_path / "d").calls}
    custom = calls["Custom.pp_capture_test.scaled_mm.0.forward"]
    assert (custom.kind, custom.op, custom.module) == ("Custom", "pp_capture_test.scaled_mm", "")
    assert torch.equal(custom.outputs[0].load(), 2.0 * (x @ net.w.detach().T))
    filled = calls["Custom.pp_capture_test.fill_out.0.forward"]
    slots = {r.slot: r for r in filled.records}
    assert torch.equal(slots["input.0"].load(), torch.zeros(2, 3))  # the buffer before the call
    assert torch.equal(slots["output.out"].load(), custom.outputs[0].load() + 1.0)  # and after
    aten = calls["Aten.add.Tensor.0.forward"]
    assert aten.op == "add.Tensor"
    assert torch.equal(aten.outputs[0].load(), out.detach())
    assert resolve_op(aten) is torch.ops.aten.add.Tensor
    with pytest.raises(NotReplayable, match="kind 'Custom' cannot be replayed"):
        resolve_op(custom)


@torch.library.custom_op("pp_capture_test::fill_with_handle", mutates_args=("out",))
def _fill_with_handle(out: torch.Tensor, x: torch.Tensor, handle: torch.Tensor) -> None:
    out.copy_(x * 3.0)


class _Buffers(torch.nn.Module):
    """vLLM's pattern: an empty buffer, viewed, filled by a kernel that also gets a handle."""

    def forward(self, x: torch.Tensor, handle: torch.Tensor) -> torch.Tensor:
        out = torch.empty(2, 4)
        view = out.view(8)
        torch.ops.pp_capture_test.fill_with_handle(view, x.reshape(8), handle)
        return view.view(2, 4) + 0.0


def test_uninitialized_memory_and_handles_are_recorded_without_data(tmp_path: Path) -> None:
    x = torch.randn(2, 4, generator=torch.Generator().manual_seed(2))
    handle = torch.tensor(140000000000, dtype=torch.int64)  # an address, as onednn_mm gets
    net = _Buffers()
    with capture(net, tmp_path / "d", level="mix"):
        net(x, handle)
    calls = {c.name: c for c in load_dump(tmp_path / "d").calls}
    empty = calls["Torch.empty.0.forward"].outputs[0]
    assert (empty.shape, empty.loader) == ((2, 4), None)  # whatever the allocator left there
    assert calls["Tensor.view.0.forward"].outputs[0].loader is None  # a view of it, unwritten
    kernel = {r.slot: r for r in calls["Custom.pp_capture_test.fill_with_handle.0.forward"].records}
    assert kernel["input.0"].loader is None  # the buffer before the call
    assert kernel["input.2"].loader is None  # the handle
    assert torch.equal(kernel["output.out"].load(), x.reshape(8) * 3.0)  # filled: data again
    assert torch.equal(calls["Tensor.add.0.forward"].outputs[0].load(), x * 3.0)


def test_default_reprs_lose_their_address() -> None:
    from pytest_precision.dump._native import encode_value

    one, two = object(), object()
    assert encode_value(one) == encode_value(two) == {"$repr": "<object object>"}
