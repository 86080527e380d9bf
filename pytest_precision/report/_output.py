"""How output-level results read in a terminal: tokens, symptoms, scores, weights, checklists and
bad cases (the CLI prints these; the assert forms keep their own short messages). What the
files say (keys, reasons, names) is shown with its control characters escaped."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .._text import shown, shown_text

if TYPE_CHECKING:
    from ..output._badcases import BadCases
    from ..output._scores import ScoreCheck
    from ..output._symptoms import Symptom
    from ..output._tokens import RowTokens, TokenComparison
    from ..output._weights import WeightsReport
    from ..runtime._environment import ChecklistDiff


def tokens_text(result: TokenComparison) -> str:
    """One block per row: its verdict and reason, and at a divergence both top-k lists."""
    passed = sum(row.passed for row in result.rows)
    lines = [
        f"tokens: {passed} of {len(result.rows)} row(s) agree (near tie within "
        f"{result.tie_margin:g} nats in the top-{result.top_k}; logprobs within "
        f"{result.logprob_tol:g})"
    ]
    for row in result.rows:
        lines.append(f"  {row.status.upper():<9} {shown(row.reason)}")
        lines.extend(_row_details(row))
    return shown_text("\n".join(lines))


def _row_details(row: RowTokens) -> list[str]:
    lines = []
    if row.context:
        lines.append(f"            after {row.context!r}")
    for label, top in (("golden", row.golden_top), ("target", row.target_top)):
        if top:
            entries = ", ".join(
                f"{e.token}{'' if e.text is None else f' {e.text!r}'} {e.logprob:.3f}" for e in top
            )
            lines.append(f"            {label} top-{len(top)}: {entries}")
    return lines


def symptoms_text(findings: Sequence[Symptom], *, what: str = "output") -> str:
    """Each finding on one line, or a line saying there was none."""
    if not findings:
        return f"no symptoms in the {what}"
    lines = [f"{len(findings)} symptom(s) in the {what}:"]
    lines += [
        f"  {f.kind:<10} at {shown(f.unit)} {shown(f.location)}: {shown(f.reason)}"
        for f in findings
    ]
    return shown_text("\n".join(lines))


def scores_text(result: ScoreCheck) -> str:
    """The acceptance table: every task, its change against the baseline and the verdict."""
    from ..output._scores import score_table

    return score_table(result)


def weights_text(result: WeightsReport) -> str:
    """The two lists users grep their logs for, then every mismatch (no truncation)."""
    from ..output._weights import weights_message

    verdict = "all loaded" if result.passed else "PROBLEMS"
    return f"{verdict}: " + weights_message(result, limit=10**9)


def diff_text(result: ChecklistDiff) -> str:
    """A config or environment diff as a table, grouped by category, most likely first."""
    if not result.changes:
        return f"no {result.what} differences"
    width = min(48, max(len(c.key) for c in result.changes))
    lines = [f"{len(result.changes)} {result.what} difference(s), most likely culprit first:"]
    category = None
    for c in result.changes:
        if c.category != category:
            category = c.category
            lines.append(f"  {category}:")
        lines.append(f"    {shown(c.key):<{width}}  {c.golden!r} -> {c.target!r}")
    return shown_text("\n".join(lines))


def badcases_text(result: BadCases, *, limit: int = 20) -> str:
    """The ranked bad cases, best lead first, and what could not be matched."""
    lines = [
        f"{len(result.cases)} of {result.matched} matched case(s) disagree "
        f"(matched by {result.matched_by})"
    ]
    for i, case in enumerate(result.cases[:limit], start=1):
        lines.append(f"  {i}. {shown(case.key)}: {shown(case.reason)}")
        if case.prompt is not None:
            lines.append(f"       prompt: {case.prompt[:100]!r}")
    if len(result.cases) > limit:
        lines.append(f"  ... and {len(result.cases) - limit} more")
    for side, keys in (("golden", result.only_golden), ("target", result.only_target)):
        if keys:
            listed = ", ".join(map(shown, keys[:10])) + (" ..." if len(keys) > 10 else "")
            lines.append(f"  only in the {side} run ({len(keys)}): {listed}")
    if result.cases:
        lines.append(f"localize case {shown(result.cases[0].key)} first")
    return shown_text("\n".join(lines))


def write_badcases_json(result: BadCases, path: str | os.PathLike[str]) -> None:
    """Every bad case, ranked, as a JSON list of objects (the fields of ``BadCase``)."""
    cases = [
        {**dataclasses.asdict(case), "score_loss": case.score_loss, "rank": i}
        for i, case in enumerate(result.cases, start=1)
    ]
    with open(path, "w", encoding="utf-8") as f:
        json.dump(cases, f, ensure_ascii=False, indent=1)
        f.write("\n")
