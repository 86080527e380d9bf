"""Capture's fast paths change nothing in the dump: a view lying exactly where an unchanged
recorded tensor lies reuses its statistics (still a record of its own), and the statistics pass
(strided tensors gathered piece by piece, blocks shared between threads) sums like one thread
over a contiguous copy."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import hf_zoo
import pytest
import torch
from dump_helpers import assert_bitwise_equal

from pytest_precision import Record, TensorStats, capture, tensor_stats
from pytest_precision.dump import _capture
from pytest_precision.dump._native import read_native_dump
from pytest_precision.dump._recorded import RecordedTensors
from pytest_precision.numerics import _chunks, _kernels, _stats_pass

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _summaries(monkeypatch: pytest.MonkeyPatch) -> list[torch.Tensor]:
    """The tensors capture summarizes from now on, in order."""
    seen: list[torch.Tensor] = []
    summarize = _capture.summarize

    def noting(t: torch.Tensor, content: bool = True) -> tuple[TensorStats | None, int | None]:
        seen.append(t)
        return summarize(t, content)

    monkeypatch.setattr(_capture, "summarize", noting)
    return seen


def _capture_stats(model: torch.nn.Module, x: torch.Tensor, path: Path) -> dict[str, Any]:
    with torch.no_grad(), capture(model, path, level="op", mode="statistics"):
        model(x)
    return {r.key: r.stats for r in read_native_dump(path) if r.is_tensor}


class _SameGeometry(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * 1
        same = y.view(y.shape)  # another object: same storage, offset, shape and strides
        flat = y.view(-1)  # another shape, the same flat run of elements
        return same.neg() + flat.view(y.shape)


def test_a_view_where_a_recorded_tensor_lies_reuses_its_statistics(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    x = torch.tensor([[1.0, -2.0, 3.0], [4.0, 5.0, -6.0]])
    summarized = _summaries(monkeypatch)
    stats = _capture_stats(_SameGeometry(), x, tmp_path)
    y = tensor_stats(x)
    assert stats["Tensor.view.0.forward.output.0"] == y
    assert stats["Tensor.neg.0.forward.input.0"] == y
    assert stats["Tensor.view.1.forward.output.0"] == y
    # Summarized: x, y, and the outputs of neg and add; every view reused y's statistics.
    assert sum(t.data_ptr() == summarized[1].data_ptr() for t in summarized) == 1
    assert len(summarized) == 4


class _WritesThroughAView(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * 1
        y.view(-1).neg()  # y recorded (as the view's input), and the flat view
        y[0].mul_(10)  # in place, through another view: y's version counter moves
        return y.view(-1).neg()


def test_an_in_place_write_between_two_views_gets_fresh_statistics(tmp_path: Path) -> None:
    x = torch.tensor([[1.0, -2.0], [3.0, 4.0]])
    stats = _capture_stats(_WritesThroughAView(), x, tmp_path)
    changed = x.clone()
    changed[0] *= 10
    assert stats["Tensor.neg.0.forward.input.0"] == tensor_stats(x)
    assert stats["Tensor.view.1.forward.input.0"] == tensor_stats(changed)
    assert stats["Tensor.neg.1.forward.input.0"] == tensor_stats(changed)


class _Negates(torch.nn.Module):
    def __init__(self, source: torch.Tensor) -> None:
        super().__init__()
        self.source = source

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.source.neg() + x


def test_a_tensor_with_its_own_version_counter_is_not_taken_for_a_view(tmp_path: Path) -> None:
    w = torch.tensor([1.0, -2.0, 3.0])
    alias = w.data  # the same memory and geometry, its own version counter
    w.add_(1)  # w at version 1
    model = _Negates(w)
    with torch.no_grad(), capture(model, tmp_path, level="op", mode="statistics") as cap:
        model(torch.zeros(3))  # w recorded at version 1
        alias.mul_(3)  # outside the forward: alias at version 1, and w's counter never moved
        model.source = alias
        cap.step()
        model(torch.zeros(3))
    stats = {(r.step, r.key): r.stats for r in read_native_dump(tmp_path)}
    assert stats[0, "Tensor.neg.0.forward.input.0"] == tensor_stats(torch.tensor([2.0, -1, 4]))
    assert stats[1, "Tensor.neg.0.forward.input.0"] == tensor_stats(torch.tensor([6.0, -3, 12]))


class _Reinterprets(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = x * 1
        # Same data pointer, shape and strides as y; other elements.
        return y.neg(), y.conj().neg(), torch.view_as_real(y).view(torch.int64).neg()


class _Strides(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = x * 1
        # Same data pointer and shape (2, 2), other strides: other elements.
        return y[:2, :2].neg(), y[::2, ::2].neg()


def test_views_that_read_the_memory_otherwise_get_their_own_statistics(tmp_path: Path) -> None:
    x = torch.tensor([1 + 2j, -3 + 0.5j, 4 - 1j], dtype=torch.complex128)
    stats = _capture_stats(_Reinterprets(), x, tmp_path)
    assert stats["Tensor.neg.0.forward.input.0"] == tensor_stats(x)
    assert stats["Tensor.neg.1.forward.input.0"] == tensor_stats(x.conj())
    assert tensor_stats(x.conj()) != tensor_stats(x)
    as_ints = torch.view_as_real(x).view(torch.int64)
    assert stats["Tensor.neg.2.forward.input.0"] == tensor_stats(as_ints)
    y = torch.arange(16.0).view(4, 4)
    stats = _capture_stats(_Strides(), y, tmp_path / "strides")
    assert stats["Tensor.neg.0.forward.input.0"] == tensor_stats(y[:2, :2])
    assert stats["Tensor.neg.1.forward.input.0"] == tensor_stats(y[::2, ::2])


def test_tensor_mode_stores_a_view_of_another_shape_apart(tmp_path: Path) -> None:
    """Records that share stored data have the same shape: a flat view gets its own copy."""
    x = torch.tensor([[1.0, -2.0, 3.0], [4.0, 5.0, -6.0]])
    model = _SameGeometry()
    with torch.no_grad(), capture(model, tmp_path, level="op", mode="tensor"):
        model(x)
    records = {r.key: r for r in read_native_dump(tmp_path)}
    y = records["Tensor.mul.0.forward.output.0"]
    assert records["Tensor.view.0.forward.output.0"].data_id == y.data_id  # same geometry
    flat = records["Tensor.view.1.forward.output.0"]
    assert flat.data_id != y.data_id
    assert flat.stats == y.stats
    assert_bitwise_equal(flat.load(), x.reshape(-1))


# -- a real model --------------------------------------------------------------------------------


def _comparable(record: Record) -> tuple[Any, ...]:
    fields = (record.key, record.kind, record.op, record.module, record.parent, record.step)
    return (*fields, record.dtype, record.shape, record.stride, repr(record.stats))


@pytest.mark.slow
@pytest.mark.skipif(not _kernels.enabled(), reason="numba is not installed")
@pytest.mark.parametrize("mode", ["statistics", "tensor"])
def test_an_hf_dump_is_the_same_without_the_fast_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    """Blocks of 4 elements make every tensor cross pieces and threads, and the float64 sums
    depend on their order: any change of order would show."""
    model = hf_zoo.build("llama", layers=1)
    monkeypatch.setattr(_kernels, "BLOCK_NUMEL", 4)
    monkeypatch.setattr(_chunks, "CHUNK_NUMEL", 64)
    before = torch.get_num_threads()

    def run(path: Path) -> list[Record]:
        with torch.no_grad(), capture(model, path, level="mix", mode=mode) as cap:  # type: ignore[arg-type]
            model(**hf_zoo.inputs(), use_cache=False)
            cap.step()
            model(**hf_zoo.inputs(), use_cache=False)
        return list(read_native_dump(path))

    try:
        torch.set_num_threads(2)
        monkeypatch.setattr(_stats_pass, "PARALLEL_STATS_NUMEL", 64)
        summarized = _summaries(monkeypatch)
        fast = run(tmp_path / "fast")
        reused = len(summarized)
        with monkeypatch.context() as mp:  # one thread, on contiguous copies, nothing reused
            mp.setattr(_stats_pass, "PARALLEL_STATS_NUMEL", 1 << 40)
            mp.setattr(_capture, "summarize", lambda t, _: (tensor_stats(t.contiguous()), None))
            mp.setattr(RecordedTensors, "key_of", lambda self, t: None)
            slow = run(tmp_path / "slow")
    finally:
        torch.set_num_threads(before)

    assert [_comparable(r) for r in fast] == [_comparable(r) for r in slow]
    for a, b in zip(fast, slow, strict=True):
        if b.loader is not None:
            assert_bitwise_equal(a.load(), b.load())  # type: ignore[arg-type]
    if mode == "statistics":  # record for record, byte for byte
        lines = [
            (p / "rank0" / "records.jsonl").read_bytes()
            for p in (tmp_path / "fast", tmp_path / "slow")
        ]
        assert lines[0] == lines[1]
    strided = [r for r in fast if r.stride is not None]
    assert strided, "the model must hand capture strided tensors, or the test compares less"
    assert reused < sum(r.is_tensor for r in fast), "nothing was reused"


def test_a_capture_flushes_only_its_complete_manifest_to_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(fd) or real_fsync(fd))
    model = torch.nn.Linear(3, 2)
    with torch.no_grad(), capture(model, tmp_path, level="mix", mode="tensor"):
        model(torch.ones(3))
    assert len(synced) == 1
    assert read_native_dump(tmp_path).records
