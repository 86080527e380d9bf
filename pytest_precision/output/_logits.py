"""Token acceptance from the logits, by a named rule: msit's, ours, or the bare one-ULP tie.

Each position (a decode step of a row) is judged from both sides' full logits over the
vocabulary. Three rules, so a team can hold a port to the standard it already uses:

- ``"msit"`` (Ascend's msit): the position passes when the cosine of the logits is at least
  0.999, the KL divergence of the golden's probabilities to the target's at most 1e-4 and the
  L1 distance of the probability vectors at most 0.01, or when the top tokens differ only by a
  one-ULP tie of ``ulp_dtype`` at the largest logit;
- ``"near-tie"`` (ours, :func:`compare_tokens`): the same top token with its logprob within
  ``logprob_tol``, or a near tie: each top token in the other's top-``top_k`` and the logprob
  gap between the two at most ``tie_margin`` on each side;
- ``"one-ulp"``: the same top token, or a one-ULP tie.

Ties are judged by value, never by index: a top token that equals the other side's largest
logit agrees with it, and "in the top-k" means fewer than k logits are larger, so permuting the
vocabulary the same way on both sides never changes a verdict.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from .._errors import PrecisionInputError
from ._common import OutputCheckFailed
from ._tokens import LOGPROB_TOL, TIE_MARGIN
from ._ulp import float_dtype, ulp

Rule = Literal["msit", "near-tie", "one-ulp"]
RULES: tuple[str, ...] = ("msit", "near-tie", "one-ulp")
#: msit's thresholds: cosine of the logits, KL(golden || target) in nats, L1 of probabilities.
MSIT_COSINE = 0.999
MSIT_KL = 1e-4
MSIT_L1 = 0.01


@dataclass(frozen=True)
class PositionLogits:
    """One position's evidence and verdict. ``index``: its place in the leading dimensions."""

    index: tuple[int, ...]
    golden_token: int
    target_token: int
    cosine: float
    kl: float
    l1: float
    #: |golden logprob - target logprob| of the golden's top token
    logprob_gap: float
    agree: bool
    near_tie: bool
    one_ulp_tie: bool
    passed: bool
    reason: str


@dataclass(frozen=True)
class LogitsComparison:
    """Every position of :func:`compare_logits` under ``rule``."""

    rule: str
    positions: tuple[PositionLogits, ...]
    ulp_dtype: Any
    top_k: int
    tie_margin: float
    logprob_tol: float

    @property
    def passed(self) -> bool:
        return all(p.passed for p in self.positions)

    @property
    def failures(self) -> tuple[PositionLogits, ...]:
        return tuple(p for p in self.positions if not p.passed)

    @property
    def acceptance_rate(self) -> float:
        """The share of positions that pass (1.0 for no positions)."""
        if not self.positions:
            return 1.0
        return sum(p.passed for p in self.positions) / len(self.positions)


def _as_logits(value: Any, side: str) -> Any:
    import torch

    if isinstance(value, (list, tuple)) and value and isinstance(value[0], torch.Tensor):
        value = torch.stack(list(value), dim=-2)  # HF generate: one (batch, vocab) per step
    try:
        tensor = torch.as_tensor(value).detach()
    except (TypeError, ValueError, RuntimeError) as exc:
        raise PrecisionInputError(f"{side}: expected logits, got {type(value).__name__}") from exc
    if tensor.ndim < 1 or tensor.shape[-1] < 1 or not tensor.is_floating_point():
        raise PrecisionInputError(
            f"{side}: expected floating logits of shape (..., vocab), got "
            f"{tuple(tensor.shape)} {tensor.dtype}"
        )
    return tensor


def compare_logits(
    golden: Any,
    target: Any,
    *,
    rule: str = "msit",
    ulp_dtype: Any = None,
    top_k: int = 5,
    tie_margin: float = TIE_MARGIN,
    logprob_tol: float = LOGPROB_TOL,
) -> LogitsComparison:
    """Judge each position of two logits tensors of the same shape ``(..., vocab)`` (or HF
    ``generate``'s tuple of ``(batch, vocab)`` per step) by ``rule`` (see the module docs).

    ``ulp_dtype``: the dtype whose ULP makes a tie (default: the target's, unless it is
    float64; pass the serving dtype when the logits were upcast, as HF does to float32).
    Every metric is computed in float64.
    """
    import torch

    if rule not in RULES:
        raise PrecisionInputError(f"rule must be one of {', '.join(RULES)}, got {rule!r}")
    if top_k < 1 or not tie_margin >= 0 or not logprob_tol >= 0:
        raise PrecisionInputError("top_k must be >= 1, tie_margin and logprob_tol >= 0")
    g_raw, t_raw = _as_logits(golden, "golden"), _as_logits(target, "target")
    if g_raw.shape != t_raw.shape:
        raise PrecisionInputError(
            f"golden logits have shape {tuple(g_raw.shape)}, target {tuple(t_raw.shape)}"
        )
    if ulp_dtype is None:
        ulp_dtype = t_raw.dtype if t_raw.dtype != torch.float64 else torch.float32
    ulp_dtype = float_dtype(ulp_dtype, "ulp_dtype")
    lead = tuple(g_raw.shape[:-1])
    g = g_raw.reshape(-1, g_raw.shape[-1]).to("cpu", torch.float64)
    t = t_raw.reshape(-1, t_raw.shape[-1]).to("cpu", torch.float64)
    metrics = _metrics(g, t, top_k)
    positions = []
    for n in range(g.shape[0]):
        index = tuple(int(i) for i in torch.unravel_index(torch.tensor(n), lead)) if lead else ()
        limits = (rule, ulp_dtype, tie_margin, logprob_tol)
        positions.append(_judge(g[n], t[n], metrics, n, index, *limits))
    return LogitsComparison(rule, tuple(positions), ulp_dtype, top_k, tie_margin, logprob_tol)


def _metrics(g: Any, t: Any, top_k: int) -> dict[str, Any]:
    """Per position (rows of ``g`` / ``t``): cosine, KL, L1, top tokens, logprobs, ranks."""
    import torch

    # each vector scaled by its largest |logit| first: tiny logits neither underflow nor meet
    # an epsilon clamp (identical vectors have cosine 1; a zero vector only with another)
    g_unit = g / g.abs().amax(-1, keepdim=True).clamp(min=torch.finfo(g.dtype).tiny)
    t_unit = t / t.abs().amax(-1, keepdim=True).clamp(min=torch.finfo(t.dtype).tiny)
    norms = g_unit.norm(dim=-1) * t_unit.norm(dim=-1)
    cosine = (g_unit * t_unit).sum(-1) / norms.clamp(min=torch.finfo(g.dtype).tiny)
    both_zero = (g.abs().amax(-1) == 0) & (t.abs().amax(-1) == 0)
    cosine = torch.where(both_zero, torch.ones_like(cosine), cosine.clamp(-1.0, 1.0))
    g_lp, t_lp = torch.log_softmax(g, -1), torch.log_softmax(t, -1)
    g_p, t_p = g_lp.exp(), t_lp.exp()
    kl_terms = torch.where(g_p > 0, g_p * (g_lp - t_lp), torch.zeros_like(g_p))
    # among a side's tied largest logits, the one the other side ranks highest: chosen by value
    # on both sides, so the pick does not depend on the vocabulary's order
    low = torch.full_like(g, -torch.inf)
    g_top = torch.where(g == g.amax(-1, keepdim=True), t, low).argmax(-1)
    t_top = torch.where(t == t.amax(-1, keepdim=True), g, low).argmax(-1)

    def rank(scores: Any, token: Any) -> Any:  # how many logits beat ``token``'s
        return (scores > scores.gather(-1, token[:, None])).sum(-1)

    return {
        "cosine": cosine,
        "kl": kl_terms.sum(-1).clamp(min=0.0),
        "l1": (g_p - t_p).abs().sum(-1),
        "g_lp": g_lp,
        "t_lp": t_lp,
        "g_top": g_top,
        "t_top": t_top,
        "t_in_g_top": rank(g, t_top) < top_k,
        "g_in_t_top": rank(t, g_top) < top_k,
    }


def _judge(
    g: Any,
    t: Any,
    m: dict[str, Any],
    n: int,
    index: tuple[int, ...],
    rule: str,
    ulp_dtype: Any,
    tie_margin: float,
    logprob_tol: float,
) -> PositionLogits:
    g_tok, t_tok = int(m["g_top"][n]), int(m["t_top"][n])
    # by value: the golden's pick is also one of the target's largest logits (it is whenever
    # the two sides' sets of largest logits meet)
    agree = bool(t[g_tok] == t[t_tok])
    if agree:
        t_tok = g_tok
    g_lp, t_lp = m["g_lp"][n], m["t_lp"][n]
    gap = abs(float(g_lp[g_tok]) - float(t_lp[g_tok]))
    gaps = (float(g_lp[g_tok] - g_lp[t_tok]), float(t_lp[t_tok] - t_lp[g_tok]))
    near = not agree and bool(m["t_in_g_top"][n]) and bool(m["g_in_t_top"][n])
    near = near and all(x <= tie_margin for x in gaps)
    one_ulp = not agree and all(
        float(side[mine] - side[theirs]) <= ulp(float(side[mine]), ulp_dtype)
        for side, mine, theirs in ((g, g_tok, t_tok), (t, t_tok, g_tok))
    )
    cos, kl, l1 = float(m["cosine"][n]), float(m["kl"][n]), float(m["l1"][n])
    name = str(ulp_dtype).removeprefix("torch.")
    if rule == "msit":
        close = cos >= MSIT_COSINE and kl <= MSIT_KL and l1 <= MSIT_L1
        passed = close or one_ulp
        reason = (
            f"cosine {cos:.6f} (>= {MSIT_COSINE:g}), KL {kl:.3g} (<= {MSIT_KL:g}), L1 "
            f"{l1:.3g} (<= {MSIT_L1:g})"
            + ("" if close or not one_ulp else f"; top tokens tie within one ULP of {name}")
        )
    elif rule == "near-tie":
        passed = (agree and gap <= logprob_tol) or near
        reason = (
            f"same top token, logprob moved {gap:.3g} nats (<= {logprob_tol:g})"
            if agree
            else f"top tokens {g_tok} vs {t_tok}, gaps {gaps[0]:.3g} / {gaps[1]:.3g} nats "
            f"({'a' if near else 'no'} near tie within {tie_margin:g})"
        )
    else:
        passed = agree or one_ulp
        reason = (
            "same top token"
            if agree
            else f"top tokens {g_tok} vs {t_tok}: {'a' if one_ulp else 'no'} tie within one "
            f"ULP of {name}"
        )
    return PositionLogits(
        index, g_tok, t_tok, cos, kl, l1, gap, agree, near, one_ulp, passed, reason
    )


class LogitsDiffer(OutputCheckFailed):
    """:func:`assert_logits_close` failed; ``result`` is the :class:`LogitsComparison`."""


def assert_logits_close(
    golden: Any,
    target: Any,
    *,
    rule: str = "msit",
    ulp_dtype: Any = None,
    top_k: int = 5,
    tie_margin: float = TIE_MARGIN,
    logprob_tol: float = LOGPROB_TOL,
) -> LogitsComparison:
    """Assert every position passes ``rule``; see :func:`compare_logits`."""
    __tracebackhide__ = True
    result = compare_logits(
        golden,
        target,
        rule=rule,
        ulp_dtype=ulp_dtype,
        top_k=top_k,
        tie_margin=tie_margin,
        logprob_tol=logprob_tol,
    )
    if not result.passed:
        lines = [
            f"{len(result.failures)} of {len(result.positions)} position(s) fail the "
            f"{result.rule!r} logits rule"
        ]
        for p in result.failures[:10]:
            lines.append(f"  position {list(p.index)}: {p.reason}")
        if len(result.failures) > 10:
            lines.append(f"  ... and {len(result.failures) - 10} more")
        raise LogitsDiffer("\n".join(lines), result)
    return result
