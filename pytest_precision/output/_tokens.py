"""Tokens: the first position where two generations part, and whether that parting is a tie.

Users meet a precision problem as "the answer changed". The first differing token is where the
investigation starts; a near tie there (each side's token in the other's top-k, logprobs within a
margin) is rounding, not a bug, and every later token sees a different prefix, so the comparison
stops at it. Before it, the tokens agree but their logprobs may not: 'right token, wrong
probability' is checked too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from .._errors import PrecisionInputError
from ._common import Decoder, OutputCheckFailed, as_rows, decoder
from ._ulp import float_dtype, one_ulp_tie

#: A near tie: the logprob gap between the two tokens, on each side, is at most this (nats).
#: bf16 logits of magnitude 10-30 round in steps of 0.06-0.125, so 0.1 covers one rounding.
TIE_MARGIN = 0.1
#: Logprobs of the same chosen token may differ by this much (nats) before it counts.
LOGPROB_TOL = 0.1


@dataclass(frozen=True)
class TokenDivergence:
    """Where two sequences of ids part (``position`` None when they are equal).

    ``position`` counts tokens after leading padding; ``golden_column`` / ``target_column`` are
    the indices in the ids as given. A token is None where that side has already ended.
    """

    position: int | None
    golden_token: int | None
    target_token: int | None
    golden_length: int
    target_length: int
    golden_column: int | None = None
    target_column: int | None = None
    row: int | None = None

    @property
    def diverged(self) -> bool:
        return self.position is not None


def _span(row: Sequence[int], pad_id: int | None) -> tuple[int, int]:
    """The columns of ``row`` left once leading and trailing padding is stripped."""
    start, end = 0, len(row)
    if pad_id is not None:
        while start < end and row[start] == pad_id:
            start += 1
        while end > start and row[end - 1] == pad_id:
            end -= 1
    return start, end


def _diverge(
    golden: list[int], target: list[int], pad_id: int | None, row: int | None
) -> TokenDivergence:
    g0, g1 = _span(golden, pad_id)
    t0, t1 = _span(target, pad_id)
    g, t = golden[g0:g1], target[t0:t1]
    common = min(len(g), len(t))
    position = next((i for i in range(common) if g[i] != t[i]), None)
    if position is None and len(g) != len(t):
        position = common
    if position is None:
        return TokenDivergence(None, None, None, len(g), len(t), row=row)
    return TokenDivergence(
        position,
        g[position] if position < len(g) else None,
        t[position] if position < len(t) else None,
        len(g),
        len(t),
        g0 + position if position < len(g) else None,
        t0 + position if position < len(t) else None,
        row,
    )


def _paired_rows(golden_ids: Any, target_ids: Any) -> tuple[list[list[int]], list[list[int]], bool]:
    golden, g_batched = as_rows(golden_ids, "golden_ids")
    target, t_batched = as_rows(target_ids, "target_ids")
    if g_batched != t_batched or len(golden) != len(target):
        raise PrecisionInputError(
            f"golden_ids has {len(golden)} row(s){'' if g_batched else ' (one sequence)'}, "
            f"target_ids {len(target)}{'' if t_batched else ' (one sequence)'}: compare the same "
            "requests"
        )
    return golden, target, g_batched


def first_divergent_token(
    golden_ids: Any, target_ids: Any, *, pad_id: int | None = None
) -> TokenDivergence | tuple[TokenDivergence, ...]:
    """The first position where ``target_ids`` differs from ``golden_ids``.

    One sequence (list, 1-D tensor or array) gives one :class:`TokenDivergence`; a batch (2-D,
    or a list of lists) gives one per row. ``pad_id`` padding at either end of a row (left
    padding of batched prompts, right padding after a row finished) is ignored. A sequence that
    ends where the other goes on diverges at its end, with None as its token.
    """
    golden, target, batched = _paired_rows(golden_ids, target_ids)
    rows = tuple(
        _diverge(g, t, pad_id, i if batched else None)
        for i, (g, t) in enumerate(zip(golden, target, strict=True))
    )
    return rows if batched else rows[0]


# --- with logprobs ------------------------------------------------------------------------------


@dataclass(frozen=True)
class TopToken:
    """One entry of a top-k list at the divergence."""

    token: int
    logprob: float
    text: str | None = None


@dataclass(frozen=True)
class LogprobMismatch:
    """A position where both sides chose ``token`` with logprobs further apart than allowed."""

    position: int
    token: int
    golden_logprob: float
    target_logprob: float
    text: str | None = None

    @property
    def gap(self) -> float:
        return abs(self.golden_logprob - self.target_logprob)


RowStatus = Literal["equal", "near-tie", "diverged", "logprobs"]


@dataclass(frozen=True)
class RowTokens:
    """One row's verdict: ``equal``, ``near-tie`` (accepted), ``diverged`` or ``logprobs``
    (same tokens, a logprob out of tolerance), with the evidence at the divergence."""

    divergence: TokenDivergence
    status: RowStatus
    reason: str
    golden_text: str | None = None
    target_text: str | None = None
    context: str | None = None
    #: Each side's logprob of its own token, and of the other side's token, at the divergence.
    golden_logprob: float | None = None
    target_logprob: float | None = None
    golden_logprob_of_target: float | None = None
    target_logprob_of_golden: float | None = None
    golden_top: tuple[TopToken, ...] = ()
    target_top: tuple[TopToken, ...] = ()
    logprob_mismatches: tuple[LogprobMismatch, ...] = ()
    compared_logprobs: int = 0

    @property
    def passed(self) -> bool:
        return self.status in ("equal", "near-tie")


@dataclass(frozen=True)
class TokenComparison:
    """Every row of :func:`compare_tokens`, and the limits it was judged with."""

    rows: tuple[RowTokens, ...]
    batched: bool
    top_k: int
    tie_margin: float
    logprob_tol: float
    #: the dtype of the one-ULP tie escape (None: not used)
    ulp_dtype: Any = None

    @property
    def passed(self) -> bool:
        return all(row.passed for row in self.rows)

    @property
    def failures(self) -> tuple[RowTokens, ...]:
        return tuple(row for row in self.rows if not row.passed)


def _logprob_rows(
    value: Any, rows: list[list[int]], batched: bool, side: str, normalize: bool = True
) -> list[Any] | None:
    """Per row, a float64 (steps, vocab) tensor of log-softmaxed scores (the raw scores with
    ``normalize=False``), aligned with the last ``steps`` columns of that row's ids (HF
    ``generate``'s ``scores`` / ``logits`` fit)."""
    if value is None:
        return None
    import torch

    if isinstance(value, (list, tuple)) and value and isinstance(value[0], torch.Tensor):
        value = torch.stack(list(value), dim=-2)  # HF generate: one (batch, vocab) per step
    tensor = torch.as_tensor(value).detach()
    want = 3 if batched else 2
    if tensor.ndim != want or not tensor.is_floating_point():
        raise PrecisionInputError(
            f"{side}: expected floating logprobs or logits of shape "
            f"{'(batch, steps, vocab)' if batched else '(steps, vocab)'}, got "
            f"{tuple(tensor.shape)} {tensor.dtype}"
        )
    if not batched:
        tensor = tensor.unsqueeze(0)
    if tensor.shape[0] != len(rows):
        raise PrecisionInputError(f"{side}: {tensor.shape[0]} rows for {len(rows)} rows of ids")
    out = []
    for i, row in enumerate(rows):
        if tensor.shape[1] > len(row):
            raise PrecisionInputError(
                f"{side}: row {i} has {tensor.shape[1]} steps of logprobs for {len(row)} ids"
            )
        scores = tensor[i].to("cpu", torch.float64)
        out.append(torch.log_softmax(scores, dim=-1) if normalize else scores)
    return out


def _at(logprobs: Any, row: list[int], column: int | None) -> Any:
    """The distribution that chose ``row[column]``, or None where none was given."""
    if logprobs is None or column is None:
        return None
    step = column - (len(row) - logprobs.shape[0])
    return logprobs[step] if step >= 0 else None


def _text(decode: Decoder | None, ids: list[int]) -> str | None:
    return None if decode is None else decode(ids)


def _top(dist: Any, k: int, decode: Decoder | None) -> tuple[TopToken, ...]:
    import torch

    values, indices = torch.topk(dist, min(k, dist.shape[-1]))
    return tuple(
        TopToken(int(i), float(v), _text(decode, [int(i)]))
        for v, i in zip(values.tolist(), indices.tolist(), strict=True)
    )


def _compare_row(
    golden: list[int],
    target: list[int],
    g_lp: Any,
    t_lp: Any,
    *,
    row: int | None,
    pad_id: int | None,
    top_k: int,
    tie_margin: float,
    logprob_tol: float,
    decode: Decoder | None,
    raw: tuple[Any, Any] = (None, None),
    ulp_dtype: Any = None,
) -> RowTokens:
    d = _diverge(golden, target, pad_id, row)
    g0, _ = _span(golden, pad_id)
    t0, _ = _span(target, pad_id)
    agreed = d.golden_length if d.position is None else d.position
    mismatches, compared = [], 0
    for p in range(agreed):
        g_dist, t_dist = _at(g_lp, golden, g0 + p), _at(t_lp, target, t0 + p)
        if g_dist is None or t_dist is None:
            continue
        compared += 1
        token = golden[g0 + p]
        g_val, t_val = float(g_dist[token]), float(t_dist[token])
        if not abs(g_val - t_val) <= logprob_tol:
            mismatches.append(LogprobMismatch(p, token, g_val, t_val, _text(decode, [token])))
    where = "" if row is None else f"row {row}: "
    if d.position is None:
        status: RowStatus = "logprobs" if mismatches else "equal"
        reason = f"{where}{d.golden_length} tokens equal"
        if mismatches:
            worst = max(mismatches, key=lambda m: m.gap)
            reason += (
                f", but {len(mismatches)} of {compared} logprobs differ by more than "
                f"{logprob_tol:g} (worst at position {worst.position}: {worst.golden_logprob:.4f} "
                f"golden vs {worst.target_logprob:.4f} target)"
            )
        return RowTokens(
            d, status, reason, logprob_mismatches=tuple(mismatches), compared_logprobs=compared
        )
    g_dist, t_dist = _at(g_lp, golden, d.golden_column), _at(t_lp, target, d.target_column)
    g_tok, t_tok = d.golden_token, d.target_token
    fields: dict[str, Any] = {
        "golden_text": None if g_tok is None else _text(decode, [g_tok]),
        "target_text": None if t_tok is None else _text(decode, [t_tok]),
        "context": _text(decode, golden[g0 + max(0, d.position - 8) : g0 + d.position]),
        "logprob_mismatches": tuple(mismatches),
        "compared_logprobs": compared,
    }
    near_tie = False
    if g_dist is not None and t_dist is not None and g_tok is not None and t_tok is not None:
        g_top, t_top = _top(g_dist, top_k, decode), _top(t_dist, top_k, decode)
        fields.update(
            golden_logprob=float(g_dist[g_tok]),
            target_logprob=float(t_dist[t_tok]),
            golden_logprob_of_target=float(g_dist[t_tok]),
            target_logprob_of_golden=float(t_dist[g_tok]),
            golden_top=g_top,
            target_top=t_top,
        )
        in_tops = t_tok in {e.token for e in g_top} and g_tok in {e.token for e in t_top}
        gaps = (
            fields["golden_logprob"] - fields["golden_logprob_of_target"],
            fields["target_logprob"] - fields["target_logprob_of_golden"],
        )
        near_tie = in_tops and all(abs(gap) <= tie_margin for gap in gaps)
    else:
        g_top = t_top = ()
    g_raw, t_raw = _at(raw[0], golden, d.golden_column), _at(raw[1], target, d.target_column)
    ulp_tie = (
        not near_tie
        and ulp_dtype is not None
        and all(x is not None for x in (g_raw, t_raw, g_tok, t_tok))
        and one_ulp_tie(g_raw, t_raw, g_tok, t_tok, ulp_dtype)  # type: ignore[arg-type]
    )
    tokens = f"golden {_token(g_tok, fields['golden_text'])} vs target "
    tokens += _token(t_tok, fields["target_text"])
    if near_tie or ulp_tie:
        within = (
            f"each in the other's top-{top_k} within {tie_margin:g} nats"
            if near_tie
            else f"their logits within one ULP of {str(ulp_dtype).removeprefix('torch.')}"
        )
        reason = (
            f"{where}near tie at position {d.position}: {tokens}, {within}; later tokens "
            "follow different prefixes, not compared"
        )
        status = "logprobs" if mismatches else "near-tie"
        if mismatches:
            reason += (
                f"; before it {len(mismatches)} logprob(s) differ by more than {logprob_tol:g}"
            )
        return RowTokens(d, status, reason, **fields)
    why = "no logprobs to judge a tie"
    if g_tok is None or t_tok is None:
        why = "golden ended" if g_tok is None else "target ended"
    elif g_top:
        why = (
            f"logprobs: golden {fields['golden_logprob']:.4f} / "
            f"{fields['golden_logprob_of_target']:.4f} for the target's token, target "
            f"{fields['target_logprob']:.4f} / {fields['target_logprob_of_golden']:.4f} for the "
            f"golden's token: not a near tie within {tie_margin:g} in the top-{top_k}"
        )
    reason = f"{where}tokens diverge at position {d.position}: {tokens} ({why})"
    return RowTokens(d, "diverged", reason, **fields)


def _token(token: int | None, text: str | None) -> str:
    if token is None:
        return "(ended)"
    return f"{token} {text!r}" if text is not None else str(token)


def compare_tokens(
    golden: Any,
    target: Any,
    *,
    golden_logprobs: Any = None,
    target_logprobs: Any = None,
    top_k: int = 5,
    tie_margin: float = TIE_MARGIN,
    logprob_tol: float = LOGPROB_TOL,
    pad_id: int | None = None,
    decode: Any = None,
    ulp_dtype: Any = None,
) -> TokenComparison:
    """Judge two generations token by token; the data behind :func:`assert_tokens_close`.

    Logprobs (or logits: they are log-softmaxed in float64) are ``(steps, vocab)`` per sequence
    or ``(batch, steps, vocab)``, or HF ``generate``'s tuple of ``(batch, vocab)`` per step,
    aligned with the last ``steps`` ids of each row. ``decode`` is a tokenizer or a callable
    ``ids -> text`` used to show tokens. ``ulp_dtype`` (e.g. ``torch.bfloat16``): a flip is
    also a tie when, on each side, its own token's logit beats the other's by at most one ULP
    of that dtype (msit's escape; pass raw logits, their magnitude sets the ULP).
    """
    if top_k < 1:
        raise PrecisionInputError(f"top_k must be at least 1, got {top_k}")
    if not tie_margin >= 0 or not logprob_tol >= 0:
        raise PrecisionInputError("tie_margin and logprob_tol must be non-negative numbers")
    g_rows, t_rows, batched = _paired_rows(golden, target)
    g_lps = _logprob_rows(golden_logprobs, g_rows, batched, "golden_logprobs")
    t_lps = _logprob_rows(target_logprobs, t_rows, batched, "target_logprobs")
    fn = decoder(decode)
    if ulp_dtype is not None:
        ulp_dtype = float_dtype(ulp_dtype, "ulp_dtype")
        raw = (
            _logprob_rows(golden_logprobs, g_rows, batched, "golden_logprobs", normalize=False),
            _logprob_rows(target_logprobs, t_rows, batched, "target_logprobs", normalize=False),
        )
    rows = tuple(
        _compare_row(
            g,
            t,
            None if g_lps is None else g_lps[i],
            None if t_lps is None else t_lps[i],
            row=i if batched else None,
            pad_id=pad_id,
            top_k=top_k,
            tie_margin=tie_margin,
            logprob_tol=logprob_tol,
            decode=fn,
            raw=(None, None) if ulp_dtype is None else _row_of(raw, i),
            ulp_dtype=ulp_dtype,
        )
        for i, (g, t) in enumerate(zip(g_rows, t_rows, strict=True))
    )
    return TokenComparison(rows, batched, top_k, tie_margin, logprob_tol, ulp_dtype)


def _row_of(raw: tuple[list[Any] | None, list[Any] | None], i: int) -> tuple[Any, Any]:
    return tuple(None if side is None else side[i] for side in raw)  # type: ignore[return-value]


class TokensDiverged(OutputCheckFailed):
    """:func:`assert_tokens_close` failed; ``result`` is the :class:`TokenComparison`."""


def assert_tokens_close(
    golden: Any,
    target: Any,
    *,
    golden_logprobs: Any = None,
    target_logprobs: Any = None,
    top_k: int = 5,
    tie_margin: float = TIE_MARGIN,
    logprob_tol: float = LOGPROB_TOL,
    pad_id: int | None = None,
    decode: Any = None,
    ulp_dtype: Any = None,
) -> TokenComparison:
    """Assert two generations agree: equal ids, or a near tie (or, with ``ulp_dtype``, a
    one-ULP tie) at the first divergence, and logprobs within ``logprob_tol`` where the tokens
    agree. See :func:`compare_tokens`."""
    __tracebackhide__ = True
    result = compare_tokens(
        golden,
        target,
        golden_logprobs=golden_logprobs,
        target_logprobs=target_logprobs,
        top_k=top_k,
        tie_margin=tie_margin,
        logprob_tol=logprob_tol,
        pad_id=pad_id,
        decode=decode,
        ulp_dtype=ulp_dtype,
    )
    if not result.passed:
        raise TokensDiverged(failure_message(result), result)
    return result


def failure_message(result: TokenComparison) -> str:
    """The assert form's message: each failing row's reason, its context and both top-k lists."""
    lines = [f"{len(result.failures)} of {len(result.rows)} row(s) fail the token comparison"]
    for row in result.failures:
        lines.append(row.reason)
        if row.context is not None:
            lines.append(f"  after: {row.context!r}")
        for label, top in (("golden", row.golden_top), ("target", row.target_top)):
            if top:
                shown = ", ".join(_top_entry(e) for e in top)
                lines.append(f"  {label} top-{len(top)}: {shown}")
        for m in row.logprob_mismatches[:5]:
            lines.append(
                f"  position {m.position} token {_token(m.token, m.text)}: logprob "
                f"{m.golden_logprob:.4f} golden vs {m.target_logprob:.4f} target"
            )
        if len(row.logprob_mismatches) > 5:
            lines.append(f"  ... and {len(row.logprob_mismatches) - 5} more logprob mismatches")
    return "\n".join(lines)


def _top_entry(entry: TopToken) -> str:
    return f"{_token(entry.token, entry.text)} {entry.logprob:.4f}"
