"""Cutting one request's rows out of a batched tensor: the rules of ``RowLayout.cut``."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from pytest_precision import PrecisionError
from pytest_precision.dump._rows import RowLayout


def _batched(alone: torch.Tensor, layout: RowLayout, seq_dim: int) -> torch.Tensor:
    """``alone`` (batch 1) placed as ``layout.row`` of a padded batch of random rows."""
    shape = list(alone.shape)
    shape[0] = layout.batch
    shape[seq_dim] = layout.padded
    batch = torch.randn(shape, dtype=torch.float64)
    index = [slice(None)] * alone.dim()
    index[0] = slice(layout.row, layout.row + 1)
    index[seq_dim] = slice(layout.start, layout.start + layout.length)
    batch[tuple(index)] = alone
    return batch


@given(
    batch=st.integers(2, 5),
    data=st.data(),
    length=st.integers(1, 6),
    extra=st.integers(0, 3),
    side=st.sampled_from(["left", "right"]),
)
def test_a_row_of_a_padded_batch_is_recovered(
    batch: int, data: st.DataObject, length: int, extra: int, side: str
) -> None:
    row = data.draw(st.integers(0, batch - 1))
    layout = RowLayout(batch, row, length, length + extra, side)  # type: ignore[arg-type]
    alone = torch.randn(1, 3, length, 4, dtype=torch.float64)  # (batch, heads, seq, dim)
    batched = _batched(alone, layout, seq_dim=2)
    cut = layout.cut(batched, tuple(alone.shape))
    assert cut is not None
    assert torch.equal(cut, alone)
    # the batch folded into the tokens: (batch * padded, hidden) against (length, hidden)
    flat = batched.permute(0, 2, 1, 3).reshape(batch * layout.padded, 12)
    cut = layout.cut(flat, (length, 12))
    assert cut is not None
    assert torch.equal(cut, alone.permute(0, 2, 1, 3).reshape(length, 12))


def test_a_batch_folded_into_heads_is_cut() -> None:
    layout = RowLayout(batch=3, row=2, length=4, padded=4)
    heads = torch.arange(3 * 2 * 4).reshape(3 * 2, 4)  # (batch * heads, seq)
    assert torch.equal(layout.cut(heads, (2, 4)), heads[4:6])  # type: ignore[arg-type]


def test_shapes_no_rule_explains_are_not_guessed() -> None:
    layout = RowLayout(batch=2, row=0, length=3, padded=5)
    assert layout.cut(torch.zeros(7, 4), (3, 4)) is None
    assert layout.cut(torch.zeros(2, 4), (2, 4, 1)) is None


def test_a_layout_that_cannot_be_is_refused() -> None:
    with pytest.raises(PrecisionError, match="not a row"):
        RowLayout(batch=2, row=2, length=3, padded=4)
    with pytest.raises(PrecisionError, match="does not fit"):
        RowLayout(batch=2, row=0, length=5, padded=4)
