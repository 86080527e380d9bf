"""The two rules that keep a partial dump (msprobe's) from misleading the judge, on dumps built
record by record: independent calls made in another order pair by content, and an input with
no recorded producer is matched to the recorded output it was made of."""

from __future__ import annotations

from pathlib import Path

import torch

from pytest_precision import Dump, compare_dumps, render
from pytest_precision.compare._alignment import align
from pytest_precision.compare._derivation import relation
from pytest_precision.dump._records import Call, Record
from pytest_precision.numerics._stats import tensor_stats


def _record(name: str, slot: str, t: torch.Tensor) -> Record:
    kind, op = name.split(".")[:2]
    return Record(
        name=name,
        slot=slot,
        kind=kind,
        op=op,
        dtype=str(t.dtype).removeprefix("torch."),
        shape=tuple(t.shape),
        stats=tensor_stats(t),
    )


def _call(name: str, **slots: torch.Tensor) -> Call:
    records = tuple(_record(name, slot.replace("_", "."), t) for slot, t in slots.items())
    kind, op = name.split(".")[:2]
    return Call(name, kind, op, None, 0, 0, records)


POSITIONS = torch.arange(6.0)


def _rotary(name: str, base: float) -> Call:
    freqs = POSITIONS[:, None] / base ** (torch.arange(4.0) / 4)
    return _call(name, input_0=freqs, output_0=freqs.cos())


def test_independent_calls_in_another_order_pair_by_content() -> None:
    golden = [_rotary("Tensor.cos.0.forward", 1e4), _rotary("Tensor.cos.1.forward", 1e6)]
    target = [_rotary("Tensor.cos.0.forward", 1e6), _rotary("Tensor.cos.1.forward", 1e4)]
    segments, permuted = align(golden, target)
    pairs, _ = segments[(0, 0)]
    assert [(g.name if g else None, t.name) for g, t in pairs] == [
        ("Tensor.cos.1.forward", "Tensor.cos.0.forward"),
        ("Tensor.cos.0.forward", "Tensor.cos.1.forward"),
    ]
    assert {(p.golden, p.target) for p in permuted} == {
        ("Tensor.cos.1.forward", "Tensor.cos.0.forward"),
        ("Tensor.cos.0.forward", "Tensor.cos.1.forward"),
    }


def test_calls_that_feed_each_other_are_not_permuted() -> None:
    """Each target call holds the content of the other golden call, but one consumes what the
    other put out: data flows between them, so the order is no accident of a ``set``."""
    a = torch.linspace(0.1, 1.0, 8)
    b, c = a.exp(), a.exp().exp()
    golden = [
        _call("Tensor.exp.0.forward", input_0=a, output_0=b),
        _call("Tensor.exp.1.forward", input_0=b, output_0=c),
    ]
    target = [
        _call("Tensor.exp.0.forward", input_0=b, output_0=c),
        _call("Tensor.exp.1.forward", input_0=a, output_0=b),
    ]
    segments, permuted = align(golden, target)
    assert permuted == []
    pairs, _ = segments[(0, 0)]
    assert [(g.name if g else None, t.name) for g, t in pairs] == [
        ("Tensor.exp.0.forward", "Tensor.exp.0.forward"),
        ("Tensor.exp.1.forward", "Tensor.exp.1.forward"),
    ]


def test_what_unrecorded_calls_keep_relates_an_input_to_an_output() -> None:
    q = torch.linspace(-2.0, 3.0, 48).reshape(1, 6, 8)
    out = _record("Functional.linear.0.forward", "output.0", q)

    def rule(t: torch.Tensor) -> str | None:
        return relation(_record("Tensor.__mul__.0.forward", "input.0", t), out)

    assert rule(q.view(1, 6, 2, 4).transpose(1, 2)) == "same elements as"
    assert rule(q.double()) == "same elements as"  # an upcast keeps every value
    half = q.shape[-1] // 2
    rotated = torch.cat((-q[..., half:], q[..., :half]), dim=-1)  # rotate_half
    assert rule(rotated) == "same magnitudes as"
    assert rule(q[..., :2]) == "part of"
    assert rule(q[..., :2] * 2.0) is None  # larger than anything in the output
    assert rule(torch.full((1, 6, 2), 0.5)) == "part of"  # fits: only its drift can tell


def _dump(part: torch.Tensor) -> Dump:
    """``y = x * 2`` recorded, then a part of something unrecorded reaching an ``add``."""
    x = torch.linspace(-1.0, 1.0, 32).reshape(4, 8)
    y = x * 2.0
    calls = [
        _call("Tensor.__mul__.0.forward", input_0=x, output_0=y),
        _call("Tensor.__add__.0.forward", input_0=part, input_1=y[:, :2], output_0=part + y[:, :2]),
    ]
    return Dump(Path("synthetic"), "native", [r for c in calls for r in c.records])


def test_an_input_drifting_where_its_match_is_exact_stays_a_source() -> None:
    """A constant whose statistics fit inside a recorded output (``part of`` it) differs,
    while that output matches exactly: nothing recorded lets it drift, so it is the source."""
    golden = torch.full((4, 2), 0.25)
    result = compare_dumps(_dump(golden), _dump(golden * 1.5))
    d = result.first_divergence
    assert d is not None, render(result)
    assert (d.name, d.rule) == ("Tensor.__add__.0.forward", "source"), d.reason
    assert "no view, cast or slice of a recorded output drifting as much" in d.reason
    assert result.derived == []
