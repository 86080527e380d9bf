"""A tensor recorded again unchanged reuses its first record's statistics and data; only then."""

from __future__ import annotations

import gc
import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from dump_helpers import assert_bitwise_equal
from hypothesis import given
from hypothesis import strategies as st

from examples.tiny_llama import TinyLlamaConfig, build_tiny_llama, example_input_ids
from pytest_precision import Record, TensorStats, capture, tensor_stats
from pytest_precision.dump import _capture
from pytest_precision.dump._native import encode_stats, json_text, read_native_dump, stats_json
from pytest_precision.dump._recorded import RecordedTensors

CONFIG = TinyLlamaConfig(num_layers=2)


def _op_statistics(model: torch.nn.Module, x: torch.Tensor, path: Path) -> dict[str, Any]:
    """The statistics of each tensor record of an op-level capture of ``model(x)``, by key."""
    with torch.no_grad(), capture(model, path, level="op", mode="statistics"):
        model(x)
    return {r.key: r.stats for r in read_native_dump(path) if r.is_tensor}


class _ChangesInPlace(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        y.add_(1)  # the same object, one version later
        return y.neg()


def test_a_tensor_changed_in_place_gets_fresh_statistics(tmp_path: Path) -> None:
    x = torch.arange(6.0)
    stats = _op_statistics(_ChangesInPlace(), x, tmp_path)
    before, after = tensor_stats(x * 2), tensor_stats(x * 2 + 1)
    assert stats["Tensor.mul.0.forward.output.0"] == before
    assert stats["Tensor.add_.0.forward.input.0"] == before
    assert stats["Tensor.add_.0.forward.output.0"] == after
    assert stats["Tensor.neg.0.forward.input.0"] == after


class _Views(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = x * 1
        # Views share y's storage, data pointer (the first two) and version counter.
        return y.neg(), y[:2].neg(), y.t().neg(), y[1:].neg()


def test_views_of_one_base_get_their_own_statistics(tmp_path: Path) -> None:
    x = torch.tensor([[1.0, -2.0], [3.0, 4.0], [50.0, 6.0]])
    stats = _op_statistics(_Views(), x, tmp_path)
    inputs = [stats[f"Tensor.neg.{n}.forward.input.0"] for n in range(4)]
    assert inputs == [tensor_stats(v) for v in (x, x[:2], x.t(), x[1:])]
    assert inputs[0] != inputs[1]  # same data pointer and version, other elements


class _SwapsData(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * 1
        y.neg()
        y.data = torch.full_like(y, 7.0)  # new storage, no version bump
        return y.neg()


def test_a_tensor_given_new_data_gets_fresh_statistics(tmp_path: Path) -> None:
    x = torch.arange(4.0)
    stats = _op_statistics(_SwapsData(), x, tmp_path)
    assert stats["Tensor.neg.0.forward.input.0"] == tensor_stats(x)
    assert stats["Tensor.neg.1.forward.input.0"] == tensor_stats(torch.full((4,), 7.0))


def _comparable(record: Record) -> tuple[Any, ...]:
    fields = (record.key, record.kind, record.op, record.module, record.parent, record.step)
    return (*fields, record.dtype, record.shape, repr(record.stats), repr(record.value))


@pytest.mark.parametrize("mode", ["tensor", "statistics"])
@pytest.mark.parametrize("level", ["module", "op", "mix"])
def test_records_are_the_same_without_reuse(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, level: str, mode: str
) -> None:
    model = build_tiny_llama(CONFIG, seed=0)
    ids = example_input_ids(CONFIG, seq=8)

    def run(path: Path) -> list[Record]:
        with torch.no_grad(), capture(model, path, level=level, mode=mode) as cap:  # type: ignore[arg-type]
            model(ids)
            cap.step()
            model(ids[:, :5])
        return list(read_native_dump(path))

    reused = run(tmp_path / "reused")
    monkeypatch.setattr(RecordedTensors, "key_of", lambda self, t: None)
    fresh = run(tmp_path / "fresh")

    assert [_comparable(r) for r in reused] == [_comparable(r) for r in fresh]
    for a, b in zip(reused, fresh, strict=True):
        loaded, expected = a.load(), b.load()
        assert (loaded is None) == (expected is None) == (mode == "statistics" or not a.is_tensor)
        if expected is not None:
            assert_bitwise_equal(loaded, expected)
    if mode == "tensor":  # the test compares something: reuse did happen
        stored = {json.loads(line)["data"]["key"] for line in _lines(tmp_path / "reused") if line}
        assert len(stored) < sum(r.is_tensor for r in reused)


def _lines(path: Path) -> list[str]:
    text = (path / "rank0" / "records.jsonl").read_text()
    return [line for line in text.splitlines() if '"data":{' in line]


def test_parameters_are_summarized_once_per_capture(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = build_tiny_llama(CONFIG, seed=0)
    ids = example_input_ids(CONFIG, seq=8)
    summarized: Counter[int] = Counter()
    summarize = _capture.summarize

    def counting(t: torch.Tensor, content: bool = True) -> tuple[TensorStats | None, int | None]:
        summarized[id(t)] += 1
        return summarize(t, content)

    monkeypatch.setattr(_capture, "summarize", counting)
    with torch.no_grad(), capture(model, tmp_path, level="mix", mode="statistics") as cap:
        for _ in range(3):  # three decode steps, each using every parameter
            model(ids)
            cap.step()
    assert all(summarized[id(p)] == 1 for p in model.parameters())


@pytest.mark.parametrize("mode", ["tensor", "statistics"])
def test_what_is_kept_for_reuse_stays_bounded(tmp_path: Path, mode: str) -> None:
    model = build_tiny_llama(CONFIG, seed=0)
    ids = example_input_ids(CONFIG, seq=8)
    params = len(list(model.parameters()))
    with torch.no_grad(), capture(model, tmp_path, level="op", mode=mode) as cap:  # type: ignore[arg-type]
        writer = cap._writer
        assert writer is not None
        for _ in range(6):
            model(ids)
            cap.step()
            gc.collect()
            # Intermediates died with the forward; their entries went with them.
            assert len(cap._recorded) <= params + 2
    assert writer._count > 6 * params  # many records, each new tensor under a new key
    assert len(writer._tails) <= params + 2  # the writer let go of every dead tensor's key


def test_keys_hold_while_unchanged_never_for_inference_tensors_and_are_let_go() -> None:
    forgotten: list[str] = []
    recorded = RecordedTensors(forgotten.append)
    with torch.inference_mode():
        t = torch.ones(3)
    recorded.remember(t, "0")
    assert recorded.key_of(t) is None
    u = torch.ones(3)
    recorded.remember(u, "1")
    assert recorded.key_of(u) == "1"
    u.mul_(2)
    assert recorded.key_of(u) is None
    recorded.remember(u, "2")
    assert forgotten == ["1"]  # recorded again: the old key can never be returned
    del u
    gc.collect()
    assert forgotten == ["1", "2"]


_FLOATS = st.floats(allow_nan=True, allow_infinity=True)
_COUNTS = st.integers(min_value=0, max_value=2**62)


@given(st.tuples(_FLOATS, _FLOATS, _FLOATS, _FLOATS), st.tuples(_COUNTS, _COUNTS, _COUNTS, _COUNTS))
def test_fast_statistics_encoding_matches_the_general_one(
    floats: tuple[float, ...], counts: tuple[int, ...]
) -> None:
    stats = TensorStats(*floats, *counts)
    assert stats_json(stats) == json_text(encode_stats(stats))
    decoded = json.loads(stats_json(stats))
    assert set(decoded) == set(TensorStats.__dataclass_fields__)
    assert all(math.isfinite(x) for x in floats) == all(
        isinstance(v, (int, float)) for v in decoded.values()
    )
