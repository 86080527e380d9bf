"""compare_logits / assert_logits_close: msit's rule at its thresholds (hand-made logits, each
metric just inside and just outside), the one-ULP escape (also in compare_tokens), and
properties: identical logits pass every rule, and permuting the vocabulary the same way on
both sides changes no verdict."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_precision import (
    OutputCheckFailed,
    PrecisionInputError,
    assert_logits_close,
    compare_logits,
    compare_tokens,
)
from pytest_precision.output._logits import MSIT_COSINE, MSIT_KL, MSIT_L1, RULES


def _msit(golden: list[float], target: list[float]) -> tuple[bool, float, float, float]:
    f64 = torch.float64
    r = compare_logits(torch.tensor([golden], dtype=f64), torch.tensor([target], dtype=f64))
    p = r.positions[0]
    return p.passed, p.cosine, p.kl, p.l1


@pytest.mark.parametrize(
    ("cos", "passes"), [(MSIT_COSINE + 1e-4, True), (MSIT_COSINE - 1e-4, False)]
)
def test_msit_cosine_threshold(cos: float, passes: bool) -> None:
    """Near-uniform probabilities (tiny logits): only the cosine of the logits can fail."""
    a, sin = 0.01, math.sqrt(1 - cos**2)
    passed, cosine, kl, l1 = _msit([a, 0.0], [a * cos, a * sin])
    assert cosine == pytest.approx(cos, abs=1e-12)
    assert kl < MSIT_KL
    assert l1 < MSIT_L1
    assert passed is passes


def _kl(g: list[float], t: list[float]) -> float:
    gp = torch.softmax(torch.tensor(g, dtype=torch.float64), -1)
    tp = torch.softmax(torch.tensor(t, dtype=torch.float64), -1)
    return float((gp * (gp.log() - tp.log())).sum())


@pytest.mark.parametrize("side", ["inside", "outside"])
def test_msit_kl_threshold(side: str) -> None:
    """A rare token that moves: KL crosses 1e-4 while the L1 stays far below 0.01 (and the
    logits stay colinear: cosine 1)."""
    rare = math.log(1e-3)
    want = MSIT_KL * (0.99 if side == "inside" else 1.01)
    lo, hi = 0.0, 5.0  # bisect the shift of the rare token that gives the wanted KL
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _kl([0.0, rare], [0.0, rare - mid]) < want else (lo, mid)
    g, t = [0.0, rare], [0.0, rare - lo]
    passed, cosine, kl, l1 = _msit(g, t)
    assert kl == pytest.approx(_kl(g, t), rel=1e-9)
    assert (kl <= MSIT_KL) is (side == "inside")
    assert l1 < MSIT_L1
    assert cosine > MSIT_COSINE
    assert passed is (side == "inside")


@pytest.mark.parametrize(("l1", "passes"), [(MSIT_L1 * 0.99, True), (MSIT_L1 * 1.01, False)])
def test_msit_l1_threshold(l1: float, passes: bool) -> None:
    """Two tokens, large equal logits: the L1 of the probabilities decides (KL ~ L1^2 / 8)."""
    # p = sigmoid(d): L1 = 2 |p - 0.5|
    p = 0.5 + l1 / 2
    d = math.log(p / (1 - p))
    passed, cosine, kl, got = _msit([100.0, 100.0], [100.0, 100.0 + d])
    assert got == pytest.approx(l1, rel=1e-9)
    assert kl < MSIT_KL
    assert cosine > MSIT_COSINE
    assert passed is passes


def _flip(gap: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The golden's top token 1 at 20.0, token 2 ``gap`` below; the target the other way."""
    g = torch.tensor([[0.0, 20.0, 20.0 - gap, 5.0]])
    t = torch.tensor([[0.0, 20.0 - gap, 20.0, 5.0]])
    return g, t


@pytest.mark.parametrize(("ulps", "passes"), [(1, True), (2, False)])
def test_the_one_ulp_escape(ulps: int, passes: bool) -> None:
    """bf16 logits at 20 round in steps of 0.125: tokens one step apart may flip."""
    g, t = _flip(0.125 * ulps)
    for rule in ("msit", "one-ulp"):
        r = compare_logits(g, t, rule=rule, ulp_dtype=torch.bfloat16)
        assert r.positions[0].one_ulp_tie is passes
        assert r.passed is passes, r.positions[0].reason
    # msit's metrics alone fail this flip (the probabilities swap): only the escape passes it
    msit = compare_logits(g, t, rule="msit", ulp_dtype=torch.bfloat16).positions[0]
    assert msit.l1 > MSIT_L1
    # in float32 the same gap is a million ULPs
    assert not compare_logits(g, t, rule="one-ulp").passed


@pytest.mark.parametrize(("ulps", "status"), [(1, "near-tie"), (2, "diverged")])
def test_compare_tokens_one_ulp_escape(ulps: int, status: str) -> None:
    g, t = _flip(0.125 * ulps)
    kwargs = {"golden_logprobs": g, "target_logprobs": t, "tie_margin": 0.0}
    assert compare_tokens([1], [2], **kwargs).rows[0].status == "diverged"  # no escape asked
    row = compare_tokens([1], [2], ulp_dtype="bfloat16", **kwargs).rows[0]
    assert row.status == status
    if status == "near-tie":
        assert "within one ULP of bfloat16" in row.reason


def test_near_tie_rule_and_the_assert_form() -> None:
    g, t = _flip(0.05)
    assert compare_logits(g, t, rule="near-tie").passed  # within 0.1 nats, in each top-5
    assert not compare_logits(g, t, rule="near-tie", tie_margin=0.01).passed
    with pytest.raises(OutputCheckFailed, match=r"1 of 1 position\(s\) fail the 'one-ulp'"):
        assert_logits_close(g, t, rule="one-ulp")
    assert assert_logits_close(g, g, rule="one-ulp").acceptance_rate == 1.0


def test_bad_input_is_refused_clearly() -> None:
    g = torch.zeros(2, 4)
    with pytest.raises(PrecisionInputError, match="rule must be one of"):
        compare_logits(g, g, rule="cosine")
    with pytest.raises(PrecisionInputError, match="shape"):
        compare_logits(g, torch.zeros(2, 5))
    with pytest.raises(PrecisionInputError, match="floating torch dtype"):
        compare_logits(g, g, ulp_dtype="int8")


logits = st.lists(
    st.floats(min_value=-30, max_value=30, allow_nan=False, width=32), min_size=2, max_size=12
)


#: target = golden + one of these per logit: exact ties, one bf16 ULP at 16-32, a real move
shifts = st.lists(st.sampled_from([0.0, 0.0, 0.125, -0.125, 1.0]), min_size=12, max_size=12)


@settings(max_examples=60, deadline=None)
@given(g=logits, noise=shifts, seed=st.integers(0, 2**16))
def test_permuting_the_vocabulary_changes_no_verdict(
    g: list[float], noise: list[float], seed: int
) -> None:
    golden = torch.tensor([g], dtype=torch.float32)
    target = golden + torch.tensor([noise[: len(g)]])
    order = torch.randperm(len(g), generator=torch.Generator().manual_seed(seed))
    for rule in RULES:
        same = compare_logits(golden, golden, rule=rule, ulp_dtype=torch.bfloat16)
        assert same.passed, same.positions[0].reason  # identical logits always pass
        kwargs = {"rule": rule, "ulp_dtype": torch.bfloat16}
        a = compare_logits(golden, target, **kwargs).positions[0]
        b = compare_logits(golden[:, order], target[:, order], **kwargs).positions[0]
        assert a.passed is b.passed, (rule, a.reason, b.reason)
