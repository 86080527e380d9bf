"""When two dumps with different rank counts are merged into one logical run each."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from tp_dumps import write_tp_dump

from pytest_precision import compare_dumps, load_dump
from pytest_precision._errors import DumpFormatError
from pytest_precision.dump._layouts import merge_layouts
from pytest_precision.dump._module_layouts import module_layouts
from pytest_precision.dump._tensor_layouts import shard
from pytest_precision.dump._writer import DumpWriter


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


# -- layouts capture recorded ---------------------------------------------------------------


def _vocabulary(rank: int, ranks: int, vocab: int = 300, padded: int = 320) -> SimpleNamespace:
    """The attributes of vLLM's VocabParallelEmbedding at rank ``rank`` of ``ranks``: its
    range of the vocabulary padded to a multiple of 64, the padding rows last."""
    rows = padded // ranks
    start = rank * rows
    return SimpleNamespace(
        tp_rank=rank, tp_size=ranks, org_vocab_size=vocab, num_added_embeddings=0,
        weight=torch.zeros(rows, 4),
        shard_indices=SimpleNamespace(
            padded_org_vocab_start_index=start, padded_org_vocab_end_index=start + rows,
            org_vocab_start_index=min(start, vocab), org_vocab_end_index=min(start + rows, vocab),
            added_vocab_start_index=vocab, added_vocab_end_index=vocab,
        ),
    )  # fmt: skip


def _write_table(path: Path, ranks: int, table: torch.Tensor, wrong: bool = False) -> Path:
    """A dump of one vocabulary table split like vLLM's over ``ranks`` ranks, with the layout
    capture records for it; the padding rows hold garbage (``wrong``: rank 1's first row off)."""
    for rank in range(ranks):
        layouts = module_layouts(_vocabulary(rank, ranks))
        writer = DumpWriter(path, rank=rank, world_size=ranks, info={}, background=False)
        writer.start()
        rows = 320 // ranks
        shard = torch.full((rows, 4), 7.0)  # the padding: whatever the allocator left
        real = table[rank * rows : (rank + 1) * rows]
        shard[: len(real)] = real
        if wrong and rank == 1:
            shard[0, 0] += 0.5
        writer.add(
            {"name": "Module.embed.VocabParallelEmbedding.forward.0", "kind": "Module",
             "op": "VocabParallelEmbedding", "module": "embed", "parent": None, "step": 0,
             "slot": "parameters.weight", "dtype": "float32", "shape": [rows, 4], "value": None,
             "layout": layouts["parameters.weight"].to_json()},
            key="0", tensor=shard,
        )  # fmt: skip
        writer.close()
    return path


def test_a_vocabulary_split_with_padding_is_merged_without_it(tmp_path: Path) -> None:
    """vLLM pads a vocabulary of 300 to 320 rows; at TP=2 rank 1 holds rows 160..299 and the
    20 padding rows. The logical table is the 300 real rows, however the padding is filled."""
    assert module_layouts(_vocabulary(1, 2))["parameters.weight"] == shard(0, 300, [(0, 140, 160)])
    table = torch.randn(300, 4, generator=torch.Generator().manual_seed(0))
    golden = _write_table(tmp_path / "tp1", 1, table)
    merged = merge_layouts(load_dump(golden), load_dump(_write_table(tmp_path / "tp2", 2, table)))
    assert merged is not None
    (logical,) = merged.target.records
    assert torch.equal(logical.load(), table)
    assert compare_dumps(golden, tmp_path / "tp2").verdict == "pass"
    result = compare_dumps(golden, _write_table(tmp_path / "wrong", 2, table, wrong=True))
    assert result.first_divergence is not None
    assert result.first_divergence.ranks == (1,)


def test_a_layer_whose_weight_is_packed_away_records_no_weight_layout() -> None:
    """vLLM on CPU packs a linear weight for oneDNN and leaves an empty parameter: its layout
    would not fit it, and is not recorded (the output's still is)."""
    layer = SimpleNamespace(
        tp_rank=0, tp_size=2, output_partition_sizes=[8], gather_output=False,
        weight=torch.empty(0), bias=None,
    )  # fmt: skip
    assert set(module_layouts(layer)) == {"output.0"}
    layer.weight = torch.zeros(8, 3)
    assert module_layouts(layer)["parameters.weight"] == shard(0, 16, [(0, 8, 0)])


@pytest.mark.parametrize(
    "layout",
    [
        {"how": "sideways"},
        {"how": "shard", "dim": 0, "size": 4, "pieces": [[0, 8, 0]]},  # past the logical end
        {"how": "shard", "dim": "0", "size": 4, "pieces": []},
        {"how": "shard", "dim": 0, "size": 4, "pieces": [[0, -1, 0]]},
    ],
)
def test_a_malformed_layout_is_refused_naming_the_file(tmp_path: Path, layout: object) -> None:
    writer = DumpWriter(tmp_path / "d", rank=0, world_size=1, info={}, background=False)
    writer.start()
    writer.add(
        {"name": "Functional.linear.0.forward", "kind": "Functional", "op": "linear",
         "module": "", "parent": None, "step": 0, "slot": "output.0", "dtype": "float32",
         "shape": [2], "value": None, "layout": layout},
        key="0", tensor=torch.zeros(2),
    )  # fmt: skip
    writer.close()
    with pytest.raises(DumpFormatError, match=r"records\.jsonl:1.*malformed layout"):
        load_dump(tmp_path / "d")
