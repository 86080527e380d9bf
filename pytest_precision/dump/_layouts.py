"""Two runs with different tensor-parallel layouts, each merged into the one logical run.

The golden often runs on one device (TP=1) and the target on eight (TP=8), or TP=2 against
TP=4. Each rank then holds a piece of what the other side holds whole, and a rank-by-rank
comparison has nothing to pair. When the two dumps have different numbers of ranks, every rank
of a side is merged into one logical record per (step, call, slot):

* **sharded**: the ranks' tensors have a dimension that, times the side's rank count, equals
  the other side's (times its own): a column-parallel output, a weight shard. The pieces are
  concatenated along it, in rank order;
* **replicated**: every rank holds the same tensor (an input after its broadcast, a reduced
  output, a norm's weight): one copy stands for all;
* **partial**: same shape, different values: the partial sums of a row-parallel projection
  before their all-reduce. They are summed (in float64, stored in the tensor's dtype). A
  statistics-only dump cannot sum statistics: such a record is left out, and named.

Where capture recorded a record's layout (``Record.layout``: a DTensor's placements, a
tensor-parallel layer's split, see :mod:`._placed`), that layout decides instead of the shapes:
the pieces of a fused q/k/v projection are placed where they belong, a vocabulary's padding is
left out, rank-local work is dropped.

The ``layouts`` table overrides the rule for records whose call name or module path matches a
pattern (``"*.qkv_proj"``): a fused projection whose shards interleave (q, k and v of each
rank side by side) is assembled by the user's function from the list of rank tensors.
What each logical record was made of is kept (``Assembly``), so that a culprit found in the
logical run can be traced back to the rank(s) that hold it.
"""

from __future__ import annotations

import fnmatch
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Literal

import torch

from .._errors import PrecisionInputError
from ..numerics._stats import TensorStats, tensor_stats
from ._placed import (
    is_plain_split,
    pick_replica,
    piece_differs,
    place,
    propagate_layouts,
    shard_dim,
)
from ._records import GARBAGE_MEMORY, Dump, Record

Assemble = Callable[[Sequence[torch.Tensor]], torch.Tensor]
#: a layout the user names: ``"replicated"``, ``"partial"``, ``("shard", dim)`` or a function
#: of the ranks' tensors (in rank order) returning the logical tensor
LayoutRule = Literal["replicated", "partial"] | tuple[Literal["shard"], int] | Assemble
How = Literal["shard", "replicated", "partial", "user"]


@dataclass(frozen=True)
class Assembly:
    """How one logical record was made from the ranks' records."""

    how: How
    #: the dimension the shards were concatenated along (``shard`` only)
    dim: int | None
    #: each rank's record, in rank order
    parts: tuple[Record, ...]
    #: the user's function that assembles them (``user`` only)
    assemble: Assemble | None = None
    #: the parts' pieces are placed where their recorded layouts say (``shard`` only)
    placed: bool = False
    #: the golden's logical record of the same call and slot, if any: where replicas
    #: disagree, the one farther from it is kept
    reference: Record | None = None


@dataclass(frozen=True)
class MergedLayouts:
    """Both sides as one logical rank each, and how the target's records were assembled."""

    golden: Dump
    target: Dump
    golden_ranks: int
    target_ranks: int
    #: ``(step, name, slot)`` of the target's logical records -> their assembly
    assembled: Mapping[tuple[int, str, str], Assembly]
    #: ``name.slot`` of records that could not be merged (partial sums without data)
    left_out: tuple[str, ...]
    #: how many records of both sides were assembled by the layouts capture recorded
    placed: int = 0


def rank_count(dump: Dump) -> int:
    return len({r.rank for r in dump.records}) or 1


def merge_layouts(
    golden: Dump, target: Dump, layouts: Mapping[str, LayoutRule] | None = None
) -> MergedLayouts | None:
    """Both dumps merged into one logical rank each, or None when they have as many ranks or
    no tensor is split between ranks (they are then compared rank by rank)."""
    ng, nt = rank_count(golden), rank_count(target)
    if ng == nt:
        return None
    rules = dict(layouts or {})
    golden = replace(golden, records=propagate_layouts(golden.records))
    target = replace(target, records=propagate_layouts(target.records))
    golden_shapes = _shapes(golden)
    target_shapes = _shapes(target)
    merged_golden, golden_assembled, golden_left = _merge(golden, ng, target_shapes, nt, rules)
    references = {(r.step, r.name, r.slot): r for r in merged_golden.records}
    merged_target, assembled, target_left = _merge(target, nt, golden_shapes, ng, rules, references)
    if not any(
        a.how in ("shard", "user") and len(a.parts) > 1
        for a in [*golden_assembled.values(), *assembled.values()]
    ):
        # no tensor is split between ranks: not another tensor-parallel size but ranks one
        # dump lacks (a crashed rank, data-parallel replicas), compared rank by rank
        return None
    return MergedLayouts(
        golden=_without_sizes(merged_golden),
        target=_without_sizes(merged_target),
        golden_ranks=ng,
        target_ranks=nt,
        assembled=assembled,
        left_out=tuple(dict.fromkeys(golden_left + target_left)),
        placed=sum(a.placed for a in [*golden_assembled.values(), *assembled.values()]),
    )


def _without_sizes(dump: Dump) -> Dump:
    """``dump`` without its size arguments (split sizes, head counts in a ``view``, slices) and
    objects passed as arguments (a layer, whose description prints its per-rank sizes): one
    layout has them per rank and the other whole. A float, a flag, a string is still compared."""
    return replace(dump, records=[r for r in dump.records if r.is_tensor or not _per_rank(r.value)])


#: what an object's description looks like: ``ParallelLMHead(num_embeddings=300, ...)``
_DESCRIBED = re.compile(r"[A-Za-z_]\w*\(.*\)", re.DOTALL)


def _per_rank(value: object) -> bool:
    """Sizes (an int, a slice, a list of them as in an index ``[..., :64]``) or a
    description."""
    if isinstance(value, (list, tuple)):
        sized = [v for v in value if v is not None and v is not Ellipsis]
        return bool(sized) and all(_per_rank(v) for v in sized)
    if isinstance(value, slice):
        return True
    return type(value) is int or (isinstance(value, str) and bool(_DESCRIBED.fullmatch(value)))


def _shapes(dump: Dump) -> dict[tuple[int, str, str], tuple[int, ...]]:
    """Each (step, name, slot)'s per-rank shape (the lowest rank's)."""
    shapes: dict[tuple[int, str, str], tuple[int, ...]] = {}
    for r in sorted(dump.records, key=lambda r: -r.rank):
        if r.shape is not None:
            shapes[(r.step, r.name, r.slot)] = r.shape
    return shapes


def _merge(
    dump: Dump,
    ranks: int,
    other_shapes: Mapping[tuple[int, str, str], tuple[int, ...]],
    other_ranks: int,
    rules: Mapping[str, LayoutRule],
    references: Mapping[tuple[int, str, str], Record] | None = None,
) -> tuple[Dump, dict[tuple[int, str, str], Assembly], list[str]]:
    if ranks == 1 and not any(r.layout is not None for r in dump.records):
        return dump, {}, []
    groups: dict[tuple[int, str, str], list[Record]] = {}
    for record in dump.records:
        groups.setdefault((record.step, record.name, record.slot), []).append(record)
    records: list[Record] = []
    assembled: dict[tuple[int, str, str], Assembly] = {}
    left_out: list[str] = []
    for key, parts in groups.items():
        parts.sort(key=lambda r: r.rank)
        first = parts[0]
        if first.layout is not None and first.layout.how == "local":
            continue  # rank-local work, no part of the logical run
        if not first.is_tensor or (len(parts) == 1 and first.layout is None):
            records.append(replace(first, rank=0))
            continue
        assembly = _assembly(parts, ranks, other_shapes.get(key), other_ranks, rules)
        if references is not None:
            assembly = replace(assembly, reference=references.get(key))
        merged = _merged_record(assembly)
        if merged is None:
            left_out.append(first.key)
            continue
        assembled[key] = assembly
        records.append(merged)
    return replace(dump, records=records), assembled, left_out


def _assembly(
    parts: list[Record],
    ranks: int,
    other: tuple[int, ...] | None,
    other_ranks: int,
    rules: Mapping[str, LayoutRule],
) -> Assembly:
    rule = _rule_for(parts[0], rules)
    if rule is not None:
        if callable(rule):
            return Assembly("user", None, tuple(parts), rule)
        if isinstance(rule, tuple):
            return Assembly("shard", rule[1], tuple(parts))
        return Assembly(rule, None, tuple(parts))
    recorded = _recorded_assembly(parts)
    if len(parts) == 1 and (
        not recorded or not recorded.placed or is_plain_split(parts, _dim(recorded))
    ):
        return Assembly("replicated", None, tuple(parts))  # one rank's tensor, as it is
    if recorded is not None:
        return recorded
    shape = parts[0].shape
    assert shape is not None
    dim = _shard_dim(shape, ranks, other, other_ranks)
    if dim is not None:
        return Assembly("shard", dim, tuple(parts))
    return Assembly("replicated" if _all_equal(parts) else "partial", None, tuple(parts))


def _recorded_assembly(parts: list[Record]) -> Assembly | None:
    """The assembly the layouts capture recorded say, when every part has one and they
    agree; None (the shapes decide) otherwise."""
    hows = {p.layout.how if p.layout is not None else None for p in parts}
    if hows == {"replicated"}:
        return Assembly("replicated", None, tuple(parts))
    if hows == {"partial"} and len(parts) > 1:
        return Assembly("partial", None, tuple(parts))
    if hows != {"shard"}:
        return None
    dim = shard_dim(parts)
    return None if dim is None else Assembly("shard", dim, tuple(parts), placed=True)


def _rule_for(record: Record, rules: Mapping[str, LayoutRule]) -> LayoutRule | None:
    for pattern, rule in rules.items():
        if fnmatch.fnmatchcase(record.name, pattern) or (
            record.module is not None and fnmatch.fnmatchcase(record.module, pattern)
        ):
            return rule
    return None


def _shard_dim(
    shape: tuple[int, ...], ranks: int, other: tuple[int, ...] | None, other_ranks: int
) -> int | None:
    """The one dimension along which this side and the other hold different pieces of the
    same logical tensor, or None."""
    if other is None or len(other) != len(shape) or other == shape:
        return None
    differing = [d for d, (a, b) in enumerate(zip(shape, other, strict=True)) if a != b]
    if len(differing) != 1:
        return None
    d = differing[0]
    return d if shape[d] * ranks == other[d] * other_ranks else None


def _all_equal(parts: Sequence[Record]) -> bool:
    first = parts[0].load()
    if first is None:  # statistics only: equal statistics stand for equal tensors
        return all(p.stats == parts[0].stats for p in parts[1:])
    for part in parts[1:]:
        other = part.load()
        if other is None or not torch.equal(first, other):
            return False
    return True


def _merged_record(assembly: Assembly) -> Record | None:
    parts = assembly.parts
    first = parts[0]
    has_data = all(p.loader is not None for p in parts)
    if assembly.how == "replicated":
        if has_data and len(parts) > 1 and first.layout and assembly.reference is not None:
            first = parts[pick_replica([_load(p) for p in parts], assembly.reference.load())]
        return replace(first, rank=0)
    if assembly.how == "shard" and all(p.memory in GARBAGE_MEMORY for p in parts):
        shape = list(first.shape or ())  # a buffer no call wrote yet: its shape, no content
        shape[_dim(assembly)] = (
            parts[0].layout.size
            if assembly.placed and parts[0].layout is not None
            else sum((p.shape or ())[_dim(assembly)] for p in parts)
        )
        return replace(first, rank=0, shape=tuple(shape))
    if not has_data and (
        assembly.how != "shard" or (assembly.placed and not is_plain_split(parts, _dim(assembly)))
    ):
        return None  # partial sums, a user's assembly, pieces that overlap: need the data
    if has_data:
        build = partial(_assemble, assembly)
        tensor = build()
        return replace(
            first,
            rank=0,
            shape=tuple(tensor.shape),
            stats=tensor_stats(tensor),
            loader=build,
            data_id=None,
            stride=None,
        )
    assert assembly.dim is not None
    shape = list(first.shape or ())
    shape[assembly.dim] = sum((p.shape or ())[assembly.dim] for p in parts)
    stats = _concatenated_stats([p.stats for p in parts])
    return replace(first, rank=0, shape=tuple(shape), stats=stats, loader=None, data_id=None)


def _assemble(assembly: Assembly) -> torch.Tensor:
    tensors = [p.load() for p in assembly.parts]
    if any(t is None for t in tensors):
        raise PrecisionInputError(f"{assembly.parts[0].key}: a rank's data is missing")
    pieces: list[torch.Tensor] = [t for t in tensors if t is not None]
    if assembly.placed:
        reference = None if assembly.reference is None else assembly.reference.load()
        return place(assembly.parts, pieces, _dim(assembly), reference)
    if assembly.how == "shard":
        return torch.cat(pieces, dim=_dim(assembly))
    if assembly.how == "partial":
        total = torch.stack([p.to(torch.float64) for p in pieces]).sum(0)
        return total.to(pieces[0].dtype)
    assert assembly.assemble is not None
    return assembly.assemble(pieces)


def _dim(assembly: Assembly) -> int:
    assert assembly.dim is not None
    return assembly.dim


def _load(record: Record) -> torch.Tensor:
    tensor = record.load()
    if tensor is None:
        raise PrecisionInputError(f"{record.key}: rank {record.rank}'s data is missing")
    return tensor


def _concatenated_stats(stats: Sequence[TensorStats | None]) -> TensorStats | None:
    """The statistics of the concatenation of tensors whose statistics these are."""
    if any(s is None for s in stats):
        return None
    known = [s for s in stats if s is not None]
    numel = sum(s.numel for s in known)
    finite = [s for s in known if not math.isnan(s.mean)]
    counted = sum(s.numel - s.nan_count - s.posinf_count - s.neginf_count for s in finite)
    return TensorStats(
        max=max((s.max for s in finite), default=math.nan),
        min=min((s.min for s in finite), default=math.nan),
        mean=(
            sum(s.mean * (s.numel - s.nan_count - s.posinf_count - s.neginf_count) for s in finite)
            / counted
            if counted
            else math.nan
        ),
        norm=math.sqrt(sum(s.norm**2 for s in finite)) if finite else math.nan,
        nan_count=sum(s.nan_count for s in known),
        posinf_count=sum(s.posinf_count for s in known),
        neginf_count=sum(s.neginf_count for s in known),
        numel=numel,
    )


def culprit_ranks(
    merged: MergedLayouts,
    key: tuple[int, str, str],
    golden: torch.Tensor | None,
    differs: Callable[[torch.Tensor, torch.Tensor], bool],
) -> tuple[int, ...]:
    """The target's ranks whose piece of logical record ``key`` (step, name, slot) differs
    from the golden's piece (``differs(target_piece, golden_piece)``). Every rank of a partial
    sum (the ranks' shares cannot be told apart), of a user's assembly, and wherever data is
    missing; every rank of a record the target holds whole."""
    assembly = merged.assembled.get(key)
    if assembly is None:
        return tuple(range(merged.target_ranks))
    ranks = tuple(p.rank for p in assembly.parts)
    pieces = [p.load() for p in assembly.parts]
    if golden is None or assembly.how in ("partial", "user") or any(p is None for p in pieces):
        return ranks
    if assembly.placed:
        dim = _dim(assembly)
        return tuple(
            p.rank
            for p, piece in zip(assembly.parts, pieces, strict=True)
            if piece is not None and piece_differs(p, piece, golden, dim, differs)
        )
    if assembly.how == "replicated":
        expected = [golden] * len(pieces)
    else:
        assert assembly.dim is not None
        sizes = [p.shape[assembly.dim] for p in pieces if p is not None]
        expected = list(torch.split(golden, sizes, dim=assembly.dim))
    return tuple(
        r
        for r, piece, want in zip(ranks, pieces, expected, strict=True)
        if piece is not None and (piece.shape != want.shape or differs(piece, want))
    )
