"""Capture records where a batch is padded: the root's attention mask carries the forward's
padding, a statistics dump holds each padded tensor's statistics over its real positions too,
and :class:`Padding` finds the positions in the layouts a decoder's tensors have."""

from __future__ import annotations

from pathlib import Path

import hf_zoo
import pytest
import torch

from pytest_precision import capture, load_dump, tensor_stats
from pytest_precision.dump._padding import Padding, padding_of

#: row 1 of hf_zoo's batch: 3 pad positions, then 5 real ones
REAL = ((True,) * 8, (False,) * 3 + (True,) * 5)


def _capture(path: Path, mode: str, mask: torch.Tensor | None = None) -> Path:
    batch = hf_zoo.inputs()
    if mask is not None:
        batch["attention_mask"] = mask
    model = hf_zoo.build("llama")
    with torch.no_grad(), capture(model, path, level="mix", mode=mode):
        model(**batch, use_cache=False)
    return path


def test_the_root_mask_record_carries_the_padding(tmp_path: Path) -> None:
    dump = load_dump(_capture(tmp_path / "d", "statistics"))
    marked = [r for r in dump.records if r.padding is not None]
    assert [(r.name, r.slot) for r in marked] == [
        ("Module.LlamaForCausalLM.forward.0", "kwargs.attention_mask")
    ]
    assert marked[0].padding == Padding(REAL, query=8)


def test_statistics_dumps_hold_the_real_positions_statistics(tmp_path: Path) -> None:
    stats = load_dump(_capture(tmp_path / "s", "statistics"))
    tensors = {(r.name, r.slot): r for r in load_dump(_capture(tmp_path / "t", "tensor"))}
    padding = Padding(REAL, query=8)
    checked = 0
    for record in stats.records:
        mate = tensors[record.name, record.slot]
        tensor = mate.load()
        if tensor is None or record.slot.startswith("parameters"):
            continue
        real = padding.real_part(tensor, every_position=True)
        if real is None:
            assert record.real_stats is None, record.key
            continue
        assert record.real_stats == tensor_stats(real), record.key
        assert record.real_stats != record.stats, record.key
        checked += 1
    assert checked > 50  # hidden states, queries, keys, scores, logits


def test_an_unpadded_batch_records_no_padding(tmp_path: Path) -> None:
    dump = load_dump(_capture(tmp_path / "d", "statistics", torch.ones(2, 8, dtype=torch.long)))
    assert not any(r.padding is not None or r.real_stats is not None for r in dump.records)


@pytest.mark.parametrize(
    ("shape", "kept", "every_position"),
    [
        ((2, 8, 64), 13 * 64, 13 * 64),  # hidden states
        ((2, 4, 8, 16), 13 * 4 * 16, 13 * 4 * 16),  # queries: (batch, heads, seq, head_dim)
        ((2, 2, 1, 8, 16), 13 * 2 * 16, 13 * 2 * 16),  # keys repeated for grouped heads
        # scores: the real queries' rows; in statistics, only the real keys of those
        ((2, 4, 8, 8), 13 * 4 * 8, (8 * 8 + 5 * 5) * 4),
        ((2, 1, 8, 8), 13 * 8, 8 * 8 + 5 * 5),  # the 4-D mask
        ((16, 4), 13 * 4, 13 * 4),  # router logits of the flattened tokens
    ],
)
def test_positions_are_found_in_a_decoders_layouts(
    shape: tuple[int, ...], kept: int, every_position: int
) -> None:
    padding = Padding(REAL, query=8)
    t = torch.arange(torch.Size(shape).numel(), dtype=torch.float32).reshape(shape)
    real = padding.real_part(t)
    assert real is not None
    assert real.numel() == kept
    everywhere = padding.real_part(t, every_position=True)
    assert everywhere is not None
    assert everywhere.numel() == every_position
    assert padding.left_out(8) == (3, 16)


@pytest.mark.parametrize("shape", [(64, 64), (2, 64), (1, 8, 16), (8,), ()])
def test_tensors_without_positions_are_compared_whole(shape: tuple[int, ...]) -> None:
    assert Padding(REAL, query=8).real_part(torch.zeros(shape)) is None


def test_a_decode_step_leaves_out_the_caches_pad_positions() -> None:
    """One new token a step: its own position is real, the cache's first three are not."""
    padding = Padding(tuple((*row, True) for row in REAL), query=1)
    assert padding.real_part(torch.zeros(2, 1, 64)) is None
    cache = padding.real_part(torch.zeros(2, 2, 9, 16))
    assert cache is not None
    assert cache.numel() == (9 + 6) * 2 * 16


def test_masks_that_do_not_pad_are_not_padding() -> None:
    ids = torch.zeros(2, 8, dtype=torch.long)
    assert padding_of((ids,), {"attention_mask": torch.ones(2, 8, dtype=torch.long)}) is None
    assert padding_of((ids,), {"attention_mask": torch.zeros(2, 1, 8, 8)}) is None
    assert padding_of((ids,), {}) is None
    found = padding_of((), {"input_ids": ids, "attention_mask": hf_zoo.inputs()["attention_mask"]})
    assert found == Padding(REAL, query=8)


def test_real_statistics_are_read_once_per_tensor_and_forward(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Records that share a tensor (an output read by three consumers) share its statistics
    over the real positions too: each tensor and shape is read for them once."""
    from pytest_precision.dump import _real_stats

    read: list[tuple[int, tuple[int, ...]]] = []
    host_stats = _real_stats.host_stats

    def counting(t: torch.Tensor) -> object:
        read.append((t.data_ptr(), tuple(t.shape)))
        return host_stats(t)

    monkeypatch.setattr(_real_stats, "host_stats", counting)
    dump = load_dump(_capture(tmp_path / "s", "statistics"))
    with_real = [r for r in dump.records if r.real_stats is not None]
    assert len(read) < len(with_real)  # shared tensors were not read again
    assert len(with_real) > 50
