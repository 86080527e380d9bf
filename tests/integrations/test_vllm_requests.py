"""One request cut out of two dumps that scheduled it differently (integrations._vllm_requests),
without vLLM: a tiny per-token model captured step by step in vLLM's flattened layout, its
requests batched, chunked and served partly "from a cache" as a vLLM scheduler would, then
judged by compare_dumps."""

from __future__ import annotations

from pathlib import Path

import torch
from hypothesis import given
from hypothesis import strategies as st

from pytest_precision import capture, compare_dumps, load_dump, render
from pytest_precision.diagnosis._batch import judged
from pytest_precision.integrations._vllm import StepBatch
from pytest_precision.integrations._vllm_requests import Piece, common_segments, request_view

HIDDEN = 8


class Tiny(torch.nn.Module):
    """Per-token layers over ``[num_tokens, hidden]``, then one row per request (its last
    scheduled token), as vLLM's model runner hands its model a step."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.proj = torch.nn.Linear(HIDDEN, HIDDEN)
        self.head = torch.nn.Linear(HIDDEN, 5)

    def forward(self, x: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
        hidden = torch.relu(self.proj(x))
        return self.head(torch.index_select(hidden, 0, last))


def _token(request: str, position: int) -> torch.Tensor:
    """The input row of ``request`` at ``position``, the same in every schedule."""
    generator = torch.Generator().manual_seed(1000 * ord(request) + position)
    return torch.randn(HIDDEN, generator=generator)


def _run(
    model: Tiny, path: Path, steps: list[list[tuple[str, int, int]]], wrong_step: int | None = None
) -> dict[int, StepBatch]:
    """Capture ``steps``, each a list of (request, first position, token count); at
    ``wrong_step`` the projection's bias is off (a bug that only that schedule meets)."""
    batches = {}
    with torch.no_grad(), capture(model, path, level="mix", mode="tensor") as cap:
        for k, step in enumerate(steps):
            cap.step(k)
            x = torch.stack([_token(r, start + i) for r, start, n in step for i in range(n)])
            ends = torch.tensor([n for _, _, n in step]).cumsum(0) - 1
            saved = model.proj.bias.clone()
            if k == wrong_step:
                model.proj.bias[:2] += 0.5
            model(x, ends)
            model.proj.bias.copy_(saved)
            batches[k] = StepBatch(
                k,
                tuple(r for r, _, _ in step),
                tuple(n for _, _, n in step),
                tuple(s for _, s, _ in step),
            )
    return batches


# the reference: both prompts in one step, then a decode; the variant: request "a" chunked in
# 4s beside "b", whose first 4 tokens came from a cache, then the same decode
REFERENCE = [[("a", 0, 10), ("b", 0, 6)], [("a", 10, 1), ("b", 6, 1)]]
VARIANT = [[("a", 0, 4), ("b", 4, 2)], [("a", 4, 4)], [("a", 8, 2)], [("b", 6, 1), ("a", 10, 1)]]


def _views(tmp_path: Path, wrong_step: int | None = None) -> dict[str, object]:
    model = Tiny()
    ref = _run(model, tmp_path / "reference", REFERENCE)
    var = _run(model, tmp_path / "variant", VARIANT, wrong_step)
    ref_dump, var_dump = load_dump(tmp_path / "reference"), load_dump(tmp_path / "variant")
    return {r: request_view((ref_dump, ref, r), (var_dump, var, r)) for r in ("a", "b")}


def test_a_clean_reschedule_compares_equal_at_the_positions_both_computed(tmp_path: Path) -> None:
    views = _views(tmp_path)
    a, b = views["a"], views["b"]
    assert [(s.start, s.end) for s in a.segments] == [(0, 4), (4, 8), (8, 10), (10, 11)]
    assert [(s.start, s.end) for s in b.segments] == [(4, 6), (6, 7)]  # 0 .. 3 were cached
    assert [s.ends_both for s in a.segments] == [False, False, True, True]
    for view in (a, b):
        result = compare_dumps(view.reference, view.variant)
        assert result.verdict == "pass", render(result)
        # a linear over other rows may round differently (the BLAS decides): noise at most
        assert judged(result)[0] in ("invariant", "noise")
    # the row the head reads is the schedule's, not the request's: taken from the reference
    assert any(key.startswith("Torch.index_select") for key in a.layout)
    head = [
        r for r in a.variant.records if r.name.startswith("Module.head") and r.slot == "output.0"
    ]
    assert {r.step for r in head} == {2, 3}  # only where both steps end for the request


def test_a_bug_met_in_one_chunk_is_found_there(tmp_path: Path) -> None:
    views = _views(tmp_path, wrong_step=1)  # request "a"'s second chunk only
    result = compare_dumps(views["a"].reference, views["a"].variant)
    culprit = result.first_divergence
    assert culprit is not None, render(result)
    assert culprit.module == "proj"
    assert culprit.step == 1  # segment 1: positions 4 .. 7
    clean = compare_dumps(views["b"].reference, views["b"].variant)
    assert clean.verdict == "pass", render(clean)


@st.composite
def _schedules(draw: st.DrawFn) -> tuple[list[Piece], list[Piece]]:
    """Two ways to compute the positions of one request: chunks from a first position on."""
    length = draw(st.integers(1, 40))

    def pieces(first: int) -> list[Piece]:
        out, start = [], first
        while start < length:
            count = draw(st.integers(1, length - start))
            out.append(Piece(len(out), start, count))
            start += count
        return out

    return pieces(draw(st.integers(0, length - 1))), pieces(draw(st.integers(0, length - 1)))


@given(_schedules(), st.integers(0, 45))
def test_segments_tile_what_both_computed_within_one_step_each(
    schedules: tuple[list[Piece], list[Piece]], upto: int
) -> None:
    reference, variant = schedules
    segments = common_segments(reference, variant, upto)
    covered = [p for s in segments for p in range(s.start, s.end)]
    both = {p for r in reference for p in range(r.start, r.end)} & {
        p for v in variant for p in range(v.start, v.end)
    }
    assert covered == sorted(p for p in both if p < upto)
    for s in segments:
        assert s.reference.start <= s.start < s.end <= s.reference.end
        assert s.variant.start <= s.start < s.end <= s.variant.end
