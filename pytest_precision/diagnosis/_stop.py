"""Whether there is anything to localize, decided by measured noise and the checklist.

Per row and decode step, up to the row's first divergent token (where both sides still read the
same prefix), the target's logprobs may differ from the golden's by at most ``factor`` times the
golden side's own error (:mod:`._noise`): two runs each within the noise of the exact result are
within twice it of each other, and the factor leaves room for a port that rounds in other
places. A token that flipped counts as a near tie only when the top-k rule of
:func:`compare_tokens` calls it one *and* the logprob gap between the two tokens, on each side,
is within that same allowance. A checklist finding is a finding: a differing weight is a source
(localized at the prefill even when the logits stay within the noise); a config difference is
reported with why it is not localized.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..output._tokens import TokenComparison
from ..runtime._environment import ChecklistDiff
from ._noise import NoiseEstimate, logprob_distance
from ._results import Finding, WeightChange

#: How many times the golden's own error the target may be off (see the module docstring).
NOISE_FACTOR = 4.0
#: Config keys that only say which dtype a side computes in: the noise estimate covers them.
_DTYPE_KEYS = frozenset({"dtype", "torch_dtype"})


@dataclass(frozen=True)
class StopDecision:
    """The finding, the decode step to localize at (None: nothing is captured), and one line
    for the tokens step and one for the stop (None when the workflow goes on)."""

    finding: Finding
    step: int | None
    tokens_line: str
    stop_line: str | None


@dataclass(frozen=True)
class _Excess:
    row: int
    step: int
    deviation: float
    allowed: float


def noise_horizon(
    tokens: TokenComparison, golden_logprobs: torch.Tensor, target_logprobs: torch.Tensor
) -> int:
    """How many leading steps of noise to measure first: up to the first step whose logprobs
    differ at all (a bitwise-equal step is within any noise) and every near tie's position.
    When :func:`decide` finds that too few, the caller measures them all."""
    steps = golden_logprobs.shape[1]
    differs = (logprob_distance(golden_logprobs, target_logprobs) > 0).any(0).nonzero()
    horizon = int(differs[0]) + 1 if len(differs) else 1
    for row in tokens.rows:
        if row.divergence.position is not None and row.status != "diverged":
            horizon = max(horizon, row.divergence.position + 1)
    return min(horizon, steps)


def decide(
    tokens: TokenComparison,
    golden_logprobs: torch.Tensor,
    target_logprobs: torch.Tensor,
    noise: NoiseEstimate,
    *,
    factor: float = NOISE_FACTOR,
    weights: tuple[WeightChange, ...] = (),
    config_diff: ChecklistDiff | None = None,
    environment_diff: ChecklistDiff | None = None,
) -> StopDecision | None:
    """The stop rule of the module docstring, on ``diagnose``'s greedy runs; None when
    ``noise`` covers too few steps to decide (a step it lacks could change the decision)."""
    deviation = logprob_distance(golden_logprobs, target_logprobs)
    steps = golden_logprobs.shape[1]
    known = min(noise.steps, steps)
    flips: list[tuple[int, str]] = []
    excess: list[_Excess] = []
    open_rows = False  # a row whose first excess, if any, lies beyond the measured steps
    for r, row in enumerate(tokens.rows):
        position = row.divergence.position
        last = steps - 1 if position is None else min(position, steps - 1)
        for s in range(last + 1):
            if float(deviation[r, s]) == 0:  # within any noise, measured or not
                continue
            if s >= known:
                open_rows = True
                break
            allowed = factor * noise.at(r, s)
            if not float(deviation[r, s]) <= allowed:
                excess.append(_Excess(r, s, float(deviation[r, s]), allowed))
                break
        if position is None:
            continue
        if row.status == "diverged":
            flips.append((position, row.reason))
            continue
        if min(position, steps - 1) >= known:
            return None
        allowed = factor * noise.at(r, min(position, steps - 1))
        gap = max(
            abs((row.golden_logprob or 0.0) - (row.golden_logprob_of_target or 0.0)),
            abs((row.target_logprob or 0.0) - (row.target_logprob_of_golden or 0.0)),
        )
        if gap > allowed:
            flips.append(
                (
                    position,
                    f"row {r}: tokens part at position {position} with a logprob gap of "
                    f"{gap:.3g} nats, beyond {factor:g} x the golden's noise ({allowed:.3g}): "
                    "not a tie",
                )
            )
    where = noise.method
    if not flips and open_rows and not excess:  # an excess in the unmeasured steps decides
        return None
    if flips:
        step = min(p for p, _ in flips)
        return StopDecision(
            "tokens", step, "first divergent token: " + "; ".join(w for _, w in flips), None
        )
    if excess:
        first = min(excess, key=lambda e: (e.step, e.row))
        line = (
            f"same tokens (or ties within noise), but logprobs move beyond the noise: row "
            f"{first.row}, step {first.step}: {first.deviation:.3g} nats against "
            f"{first.allowed:.3g} ({factor:g} x the golden's own error; {where}); "
            f"localizing at {'the prefill' if first.step == 0 else f'decode step {first.step}'}"
        )
        return StopDecision("logprobs", first.step, line, None)
    ties = sum(r.status == "near-tie" for r in tokens.rows)
    extra = f"; {ties} row(s) part at a tie within noise" if ties else ""
    tokens_line = (
        f"no difference beyond noise: {steps} greedy tokens per row agree and every logprob is "
        f"within {factor:g} x the golden's own error ({where}){extra}"
    )
    if weights:
        names = ", ".join(w.name for w in weights[:5])
        return StopDecision(
            "weights",
            0,
            tokens_line,
            f"the logits stay within noise, but {len(weights)} parameter(s) differ ({names}): "
            "a source; localizing at the prefill",
        )
    config = [
        c.key for c in (config_diff.changes if config_diff else ()) if c.key not in _DTYPE_KEYS
    ]
    if config:
        return StopDecision(
            "config",
            None,
            tokens_line,
            f"the logits stay within noise, but the config differs in {', '.join(config[:5])}: "
            "a config is no tensor in a dump, so it is not localized; it did not change this "
            "prompt's logits (check generation settings and special token ids by hand)",
        )
    stop = "tokens and logprobs agree within noise: nothing to localize"
    if environment_diff:
        keys = ", ".join(c.key for c in environment_diff.changes[:5])
        stop += (
            f"; the environment differs ({keys}), and that moved the logits by no more than "
            "the noise"
        )
    return StopDecision("no difference", None, tokens_line, stop)
