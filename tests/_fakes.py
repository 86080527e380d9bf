"""A stand-in for ``torch.cuda`` / ``torch.npu`` that records calls; it never runs anything."""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any

import pytest
import torch
from torch._utils import _LazySeedTracker


class FakeAccelerator:
    """The subset of the ``torch.cuda``-like API the device layer uses, recording each call."""

    def __init__(self, count: int = 2, *, initialized: bool = True, available: bool = True):
        self.count = count
        self.initialized = initialized
        self.available = available
        self.states: list[Any] = [f"initial state {index}" for index in range(count)]
        self.calls: list[tuple[Any, ...]] = []
        self._lazy_seed_tracker = _LazySeedTracker()

    def is_available(self) -> bool:
        return self.available

    def device_count(self) -> int:
        return self.count

    def is_initialized(self) -> bool:
        return self.initialized

    def manual_seed_all(self, seed: int) -> None:
        self.calls.append(("manual_seed_all", seed))

        def apply() -> None:
            self.states = [f"seeded {seed}"] * self.count

        if self.initialized:
            apply()
        else:
            self._queue_seed(apply)

    def _queue_seed(self, apply: Any) -> None:
        """What torch.cuda does before initialization: keep the seed in its tracker."""
        self._lazy_seed_tracker.queue_seed_all(apply, [])

    def get_rng_state_all(self) -> list[Any]:
        return list(self.states)

    def set_rng_state_all(self, states: list[Any]) -> None:
        self.calls.append(("set_rng_state_all", list(states)))
        self.states = list(states)

    def synchronize(self, index: int) -> None:
        self.calls.append(("synchronize", index))

    def get_device_name(self, index: int) -> str:
        return "Fake Accelerator 9000"


class FakeTorchNpu(FakeAccelerator):
    """Lazy seeding the way ``torch_npu`` does it: no seed tracker; seeding an uninitialized
    device appends to ``_queued_calls``, which initialization runs in order."""

    def __init__(self, count: int = 2, *, initialized: bool = False) -> None:
        super().__init__(count, initialized=initialized)
        del self._lazy_seed_tracker
        self._queued_calls: list[tuple[Any, list[str]]] = []

    def _queue_seed(self, apply: Any) -> None:
        self._queued_calls.append((apply, []))

    def init(self) -> None:
        """What the first use of the device does: run the queued calls."""
        self.initialized = True
        for call, _ in self._queued_calls:
            call()
        self._queued_calls.clear()


def install_fake_npu(
    monkeypatch: pytest.MonkeyPatch, npu: FakeAccelerator, *, cann: str = "8.1.RC1"
) -> types.ModuleType:
    """Make ``import torch_npu`` succeed and ``torch.npu`` be ``npu`` for one test."""
    torch_npu = types.ModuleType("torch_npu")
    torch_npu.__version__ = "2.13.0.fake"  # type: ignore[attr-defined]
    torch_npu.utils = types.SimpleNamespace(  # type: ignore[attr-defined]
        get_cann_version=lambda module="CANN": cann
    )
    monkeypatch.setitem(sys.modules, "torch_npu", torch_npu)
    monkeypatch.setattr(torch, "npu", npu, raising=False)
    return torch_npu


def install_fake_cuda(monkeypatch: pytest.MonkeyPatch, cuda: FakeAccelerator) -> None:
    """Make this CPU-only torch look like a CUDA build whose ``torch.cuda`` is ``cuda``."""
    # torch.use_deterministic_algorithms imports torch._inductor on its first call, and that
    # import reads torch.cuda: import it while torch.cuda is the real one.
    importlib.import_module("torch._inductor")
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    monkeypatch.setattr(torch, "cuda", cuda)
