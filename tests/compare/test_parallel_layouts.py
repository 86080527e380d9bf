"""Comparison across tensor-parallel sizes: TP=1 against TP=2, TP=2 against TP=4, on real
gloo runs. A clean pair passes; a wrong weight shard is convicted at its module, on the rank
that holds it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tp_layouts import capture_tp

from pytest_precision import compare_dumps, render

pytestmark = pytest.mark.slow  # each TP run spawns gloo processes


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tp")
    out = {}
    for world, variant, mode in [
        (1, "clean", "tensor"),
        (2, "clean", "tensor"),
        (2, "shard", "tensor"),
        (4, "clean", "tensor"),
        (4, "shard", "tensor"),
        (1, "clean", "statistics"),
        (2, "shard", "statistics"),
    ]:
        out[f"tp{world}-{variant}-{mode}"] = capture_tp(root, world, variant, mode)
    return out


@pytest.mark.parametrize(
    ("golden", "target"),
    [("tp1-clean-tensor", "tp2-clean-tensor"), ("tp2-clean-tensor", "tp4-clean-tensor")],
)
def test_clean_runs_of_different_tp_sizes_pass(
    runs: dict[str, Path], golden: str, target: str
) -> None:
    result = compare_dumps(runs[golden], runs[target])
    assert result.verdict == "pass", render(result)
    assert result.layouts is not None
    assert result.layouts.target_ranks == int(target[2])


@pytest.mark.parametrize(
    ("golden", "target", "rank"),
    [
        ("tp1-clean-tensor", "tp2-shard-tensor", 1),
        ("tp2-clean-tensor", "tp4-shard-tensor", 3),
        ("tp1-clean-tensor", "tp4-shard-tensor", 3),
    ],
)
def test_a_wrong_shard_is_convicted_on_its_rank(
    runs: dict[str, Path], golden: str, target: str, rank: int
) -> None:
    result = compare_dumps(runs[golden], runs[target])
    d = result.first_divergence
    assert d is not None, render(result)
    assert d.module == "layers.1.up"
    assert d.ranks == (rank,)
    assert f"target rank(s) {rank}" in render(result)


def test_statistics_dumps_merge_shards_and_leave_partial_sums_out(
    runs: dict[str, Path],
) -> None:
    result = compare_dumps(runs["tp1-clean-statistics"], runs["tp2-shard-statistics"])
    d = result.first_divergence
    assert d is not None
    assert d.module == "layers.1.up"
    assert result.layouts is not None
    assert result.layouts.left_out  # the down projections' partial sums: no data to add
    assert "partial sum(s) or overlapping pieces without data left out" in render(result)


def test_the_same_layout_is_compared_rank_by_rank(runs: dict[str, Path]) -> None:
    result = compare_dumps(runs["tp2-clean-tensor"], runs["tp2-shard-tensor"])
    assert result.layouts is None
    d = result.first_divergence
    assert d is not None
    assert (d.module, d.rank) == ("layers.1.up", 1)


def test_a_user_layout_assembles_interleaved_shards(runs: dict[str, Path]) -> None:
    """A rule for the up projection's output that reverses the ranks' order: the pieces then
    no longer line up with the golden's, and the output is convicted where a wrong layout
    puts it (what a fused q/k/v projection without its rule looks like)."""
    reversed_order = {"*layers.0.up*": lambda parts: torch.cat(parts[::-1], dim=-1)}
    golden, target = runs["tp1-clean-tensor"], runs["tp2-clean-tensor"]
    assert compare_dumps(golden, target).verdict == "pass"
    result = compare_dumps(golden, target, layouts=reversed_order)
    d = result.first_divergence
    assert d is not None
    assert d.module is not None
    assert d.module.startswith("layers.0")
