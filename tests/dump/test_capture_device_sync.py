"""Capture of an accelerator's tensors does not synchronise the device per record.

There is no GPU here, so the device path runs on CPU tensors (``_writer.reduced_on_device``
patched to say yes) and the device is simulated where it matters: every host copy the path
starts gets an event (``FakeEvent``) that completes in order, as a device stream does, and
spies count, on the thread running the model, what would stall a real device: a wait on such
an event that has not passed, and any read of a tensor's value on the host (``item``,
``tolist``, ``float()``, ``int()``, ``bool()``, ``numpy``, ``cpu``) other than of the host
copies themselves. The same spies, pointed at the host path with the torch pipeline, see its
reads grow with the records: the counting works.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

from pytest_precision import capture, load_dump
from pytest_precision.dump import _writer
from pytest_precision.numerics import _device_stats, _kernels

#: What reads a tensor's value on the host.
_READS = ("item", "tolist", "__float__", "__int__", "__bool__", "__index__", "numpy", "cpu")


@dataclass
class FakeStream:
    """Events recorded in order; a wait for one completes it and every earlier one."""

    recorded: int = 0
    done: int = 0
    waits_on_model_thread: int = 0
    model_thread: int = field(default_factory=threading.get_ident)


class FakeEvent:
    def __init__(self, stream: FakeStream) -> None:
        stream.recorded += 1
        self.index = stream.recorded
        self.stream = stream

    def query(self) -> bool:
        return self.stream.done >= self.index

    def synchronize(self) -> None:
        if threading.get_ident() == self.stream.model_thread:
            self.stream.waits_on_model_thread += 1
        self.stream.done = max(self.stream.done, self.index)


@dataclass
class Spies:
    stream: FakeStream
    host_copies: set[int] = field(default_factory=set)
    reads: list[str] = field(default_factory=list)


@pytest.fixture
def spies(monkeypatch: pytest.MonkeyPatch) -> Spies:
    _writer.host_stats(torch.zeros(1))  # the dtype probe's own reads, before counting
    found = Spies(FakeStream())
    start = _device_stats._start_host_copy

    def start_host_copy(t: torch.Tensor) -> tuple[torch.Tensor, Any]:
        host, _ = start(t)
        found.host_copies.add(host.data_ptr())
        return host, FakeEvent(found.stream)

    monkeypatch.setattr(_device_stats, "_start_host_copy", start_host_copy)
    for name in _READS:
        original = getattr(torch.Tensor, name)

        def spy(self: torch.Tensor, *args: Any, _o: Any = original, _n: str = name) -> Any:
            on_model_thread = threading.get_ident() == found.stream.model_thread
            if on_model_thread and self.data_ptr() not in found.host_copies:
                found.reads.append(_n)
            return _o(self, *args)

        monkeypatch.setattr(torch.Tensor, name, spy)
    return found


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for _ in range(6):
        layers += [torch.nn.Linear(16, 16), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers).eval()


def _capture(path: Path, mode: str, forwards: int) -> int:
    """Capture ``forwards`` forwards (one step each); the number of records."""
    model, x = _model(), torch.randn(4, 16)
    with torch.no_grad(), capture(model, path, level="mix", mode=mode) as cap:  # type: ignore[arg-type]
        for step in range(forwards):
            cap.step(step)
            model(x + step)
    return len(load_dump(path).records)


@pytest.mark.parametrize("mode", ["statistics", "tensor"])
def test_capture_on_a_device_reads_nothing_back_per_record(
    mode: str, spies: Spies, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(_writer, "reduced_on_device", lambda t: True)
    records = _capture(tmp_path / "many", mode, forwards=24)
    assert records > 2 * _writer._LINES_PER_WRITE  # several batches
    # the device path ran: a copy per tensor recorded (a weight seen again shares its data)
    assert spies.stream.recorded > 300
    assert spies.reads == []
    batches = -(-records // _writer._LINES_PER_WRITE)
    # statistics: the model's thread waits about once per batch of records (the writer has no
    # thread of its own in this mode; a batch also holds the "forget" marks between records);
    # tensors: the writer's thread does all the waiting
    assert spies.stream.waits_on_model_thread <= (2 * batches if mode == "statistics" else 0)


def test_the_statistics_from_the_device_path_are_the_host_path_s(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _capture(tmp_path / "host", "statistics", forwards=2)
    monkeypatch.setattr(_writer, "reduced_on_device", lambda t: True)
    _capture(tmp_path / "device", "statistics", forwards=2)
    host, device = load_dump(tmp_path / "host").records, load_dump(tmp_path / "device").records
    assert [r.name for r in device] == [r.name for r in host]
    for h, d in zip(host, device, strict=True):
        assert (h.stats is None) == (d.stats is None)
        if h.stats is not None and d.stats is not None:
            assert d.stats.numel == h.stats.numel
            assert (d.stats.max, d.stats.min) == (h.stats.max, h.stats.min)
            assert d.stats.mean == pytest.approx(h.stats.mean, rel=1e-12, abs=1e-15)
            assert d.stats.norm == pytest.approx(h.stats.norm, rel=1e-12)


def test_device_statistics_of_odd_tensors_match_tensor_stats() -> None:
    from pytest_precision import tensor_stats

    cases = [
        torch.tensor([1.0, float("nan"), float("inf"), -float("inf"), -0.0]),
        torch.tensor([float("nan")] * 3),
        torch.empty(0),
        torch.arange(-5, 7, dtype=torch.int32).reshape(3, 4).t(),
        torch.tensor([True, False, True]),
        torch.randn(3, 5, dtype=torch.complex64),
        torch.randn(70_000, dtype=torch.bfloat16),
    ]
    for t in cases:
        got, want = _device_stats.DeviceStats(t).result(), tensor_stats(t)
        assert got.to_dict() == pytest.approx(want.to_dict(), rel=1e-12, nan_ok=True), t.dtype


def test_the_spies_see_the_host_path_reads_grow_with_the_records(
    spies: Spies, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(_kernels.ENV_SWITCH, "0")  # the torch pipeline, as off the CPU
    _capture(tmp_path / "few", "statistics", forwards=2)
    few = len(spies.reads)
    _capture(tmp_path / "more", "statistics", forwards=8)
    assert len(spies.reads) - few > 2 * few > 0
