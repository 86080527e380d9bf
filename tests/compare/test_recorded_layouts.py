"""Comparison across tensor-parallel sizes by the layouts capture records, on real gloo runs:
a DTensor model (torch.distributed.tensor.parallel) and a stack of layers with the attributes
of vLLM's parallel layers (a vocabulary split with padding, fused q/k/v with a k/v head shared
by both ranks, fused gate/up).
Their shards cannot be put together by shapes alone; without a user table, a clean TP=1 / TP=2
pair passes and a wrong element in one rank's piece is convicted at its module, on its rank."""

from __future__ import annotations

from pathlib import Path

import pytest
from tp_recorded import HEAD, HEADS, HIDDEN, KV_HEADS, PADDED, VOCAB, capture_runs

from pytest_precision import compare_dumps, load_dump, render
from pytest_precision.dump._tensor_layouts import Piece

pytestmark = pytest.mark.slow  # each TP=2 run spawns gloo processes


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("recorded")
    tp2 = [
        ("dtensor", "clean"),
        ("dtensor", "up"),
        ("fused", "clean"),
        ("fused", "q"),
        ("fused", "k"),
    ]
    return {
        **capture_runs(root, 1, [("dtensor", "clean"), ("fused", "clean")]),
        **capture_runs(root, 2, tp2),
    }


@pytest.mark.parametrize("kind", ["dtensor", "fused"])
def test_clean_runs_of_different_tp_sizes_pass(runs: dict[str, Path], kind: str) -> None:
    result = compare_dumps(runs[f"{kind}-tp1-clean"], runs[f"{kind}-tp2-clean"])
    assert result.verdict == "pass", render(result)
    assert result.first_divergence is None
    assert result.layouts is not None
    assert result.layouts.placed > 0
    assert "placed by the layouts capture recorded" in render(result)


@pytest.mark.parametrize(
    ("target", "module"),
    [
        ("dtensor-tp2-up", "layers.1.up"),  # a DTensor weight's shard on rank 1
        ("fused-tp2-q", "layers.1.qkv_proj"),  # rank 1's q heads
        ("fused-tp2-k", "layers.1.qkv_proj"),  # rank 1's copy of the k head rank 0 also holds
    ],
)
def test_a_wrong_piece_is_convicted_at_its_module_on_its_rank(
    runs: dict[str, Path], target: str, module: str
) -> None:
    golden = runs[f"{target.split('-')[0]}-tp1-clean"]
    result = compare_dumps(golden, runs[target])
    d = result.first_divergence
    assert d is not None, render(result)
    assert d.module == module, render(result)
    assert d.ranks == (1,), render(result)


def test_capture_records_where_each_rank_piece_sits(runs: dict[str, Path]) -> None:
    """Rank 1 of the fused q/k/v projection: its two q heads land after rank 0's, its copy of
    the only k/v head where the k and v heads begin; its part of the vocabulary without the
    padding; the DTensor's shard by its placement."""
    dump = load_dump(runs["fused-tp2-clean"])
    weight = next(
        r
        for r in dump.records
        if r.rank == 1 and r.module == "layers.0.qkv_proj" and r.slot == "parameters.weight"
    )
    q, kv = HEADS * HEAD, KV_HEADS * HEAD
    assert weight.layout is not None
    assert weight.layout.size == q + 2 * kv
    assert weight.layout.pieces == (
        Piece(0, q // 2, q // 2),
        Piece(q // 2, kv, q),
        Piece(q // 2 + kv, kv, q + kv),
    )
    # the vocabulary: rank 1's real rows, not its padding; its masked lookup is rank-local
    table = next(
        r
        for r in dump.records
        if r.rank == 1 and r.module == "embed_tokens" and r.slot == "parameters.weight"
    )
    assert table.layout is not None
    assert table.layout.size == VOCAB
    assert table.layout.pieces == (Piece(0, VOCAB - PADDED // 2, PADDED // 2),)
    lookup = [r for r in dump.records if r.rank == 1 and r.name == "Functional.embedding.0.forward"]
    assert lookup
    assert all(r.layout is not None and r.layout.how == "local" for r in lookup if r.is_tensor)
    dtensor = load_dump(runs["dtensor-tp2-clean"])
    up = next(
        r
        for r in dtensor.records
        if r.rank == 1 and r.module == "layers.0.up" and r.slot == "parameters.weight"
    )
    assert up.shape is not None
    assert up.layout is not None
    assert (up.layout.how, up.layout.dim) == ("shard", 0)
    assert up.layout.pieces == (Piece(0, up.shape[0], up.shape[0]),)
    assert up.shape[1] == HIDDEN
