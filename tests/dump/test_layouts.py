"""When two dumps with different rank counts are merged into one logical run each."""

from __future__ import annotations

from pathlib import Path

from tp_dumps import write_tp_dump

from pytest_precision import compare_dumps, load_dump
from pytest_precision.dump._layouts import merge_layouts


def test_ranks_with_nothing_split_between_them_are_not_merged(tmp_path: Path) -> None:
    """Two ranks whose tensors have the shapes of the other dump's one rank (data-parallel
    replicas, or a rank the other dump lacks) are no tensor-parallel layout: summing their
    activations as partial sums would invent a divergence. They are compared rank by rank."""
    two = load_dump(write_tp_dump(tmp_path / "two", ranks=2, steps=1, layers=2))
    one = load_dump(write_tp_dump(tmp_path / "one", ranks=1, steps=1, layers=2))
    assert merge_layouts(two, one) is None
    result = compare_dumps(two, one)
    assert result.layouts is None
    assert [(side, rank) for side, _, rank, _ in result.one_sided] == [("golden", 1)]
