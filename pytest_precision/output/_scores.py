"""Scores: the evaluation-level acceptance rule (a score within 0.4 % of its baseline).

MindSpore Transformers' precision guide accepts a port when each dataset score is within 0.4 %
of the baseline's. The change is relative to the baseline (a baseline of 0 is judged on the
absolute change); ``direction`` says whether only drops count or any change does.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from .._errors import PrecisionInputError
from ._common import OutputCheckFailed

#: The guide's acceptance rule: within 0.4 % of the baseline.
DEFAULT_REL = 0.004

Direction = Literal["drop", "both"]


@dataclass(frozen=True)
class ScoreRow:
    """One task: its score, the baseline, the relative change (negative: a drop) and the limit."""

    task: str
    score: float
    baseline: float
    change: float
    limit: float
    passed: bool

    @property
    def relative(self) -> bool:
        """False where the baseline is 0 and ``change`` is absolute."""
        return self.baseline != 0


@dataclass(frozen=True)
class ScoreCheck:
    """Every task of :func:`check_scores`; ``direction`` is ``drop`` or ``both``."""

    rows: tuple[ScoreRow, ...]
    direction: Direction

    @property
    def passed(self) -> bool:
        return all(row.passed for row in self.rows)

    @property
    def failures(self) -> tuple[ScoreRow, ...]:
        return tuple(row for row in self.rows if not row.passed)


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise PrecisionInputError(f"{where}: a score is a number, got {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise PrecisionInputError(f"{where}: score {value} is not finite")
    return value


def _row(task: str, score: Any, baseline: Any, rel: float, direction: Direction) -> ScoreRow:
    s = _number(score, f"score of {task!r}" if task else "score")
    b = _number(baseline, f"baseline of {task!r}" if task else "baseline")
    change = (s - b) / abs(b) if b != 0 else s - b
    # A hair of slack: 0.4 % of 0.7 is not exactly representable, and a score exactly at the
    # limit passes.
    within = abs(change) <= rel * (1 + 1e-9) if direction == "both" else change >= -rel * (1 + 1e-9)
    return ScoreRow(task, s, b, change, rel, within)


def check_scores(
    score: float | Mapping[str, float],
    baseline: float | Mapping[str, float],
    *,
    rel: float | Mapping[str, float] = DEFAULT_REL,
    direction: Direction = "both",
) -> ScoreCheck:
    """Judge one score, or a table ``{task: score}`` against ``{task: baseline}``.

    ``rel`` is the allowed relative change (0.004 = 0.4 %), one for all tasks or per task.
    ``direction="both"`` (the guide's "within 0.4 %") fails a rise as well as a drop: a port
    that scores clearly higher is not computing the same thing either; ``"drop"`` fails drops
    only. Every task of the baseline must have a score, and no score may lack a baseline.
    """
    if direction not in ("drop", "both"):
        raise PrecisionInputError(f"direction must be 'drop' or 'both', got {direction!r}")
    if isinstance(score, Mapping) != isinstance(baseline, Mapping):
        raise PrecisionInputError("score and baseline: give two numbers or two {task: score} maps")
    if not isinstance(score, Mapping) or not isinstance(baseline, Mapping):
        limit = _limit(rel, "")
        return ScoreCheck((_row("", score, baseline, limit, direction),), direction)
    missing = [task for task in baseline if task not in score]
    extra = [task for task in score if task not in baseline]
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"no score for baseline task(s) {', '.join(map(repr, missing))}")
        if extra:
            parts.append(f"no baseline for task(s) {', '.join(map(repr, extra))}")
        raise PrecisionInputError("; ".join(parts))
    rows = tuple(
        _row(str(task), score[task], baseline[task], _limit(rel, str(task)), direction)
        for task in baseline
    )
    return ScoreCheck(rows, direction)


def _limit(rel: float | Mapping[str, float], task: str) -> float:
    if isinstance(rel, Mapping):
        if task not in rel:
            raise PrecisionInputError(f"rel: no limit for task {task!r}")
        rel = rel[task]
    value = _number(rel, f"rel for {task!r}" if task else "rel")
    if value < 0:
        raise PrecisionInputError(f"rel must be non-negative, got {value}")
    return value


class ScoreOutOfTolerance(OutputCheckFailed):
    """:func:`assert_score_within` failed; ``result`` is the :class:`ScoreCheck`."""


def assert_score_within(
    score: float | Mapping[str, float],
    baseline: float | Mapping[str, float],
    *,
    rel: float | Mapping[str, float] = DEFAULT_REL,
    direction: Direction = "both",
) -> ScoreCheck:
    """Assert each score is within ``rel`` (default 0.4 %) of its baseline; on failure the
    message is a table of every task. See :func:`check_scores` for the arguments."""
    __tracebackhide__ = True
    result = check_scores(score, baseline, rel=rel, direction=direction)
    if not result.passed:
        raise ScoreOutOfTolerance(score_table(result), result)
    return result


def score_table(result: ScoreCheck) -> str:
    """The assert form's message: one line per task, the failing ones marked."""
    which = "any change" if result.direction == "both" else "a drop"
    lines = [
        f"{len(result.failures)} of {len(result.rows)} score(s) off their baseline by more "
        f"than the limit ({which} counts)",
        f"  {'task':<24} {'score':>10} {'baseline':>10} {'change':>9} {'limit':>8}  verdict",
    ]
    for row in result.rows:
        change = f"{100 * row.change:+.2f} %" if row.relative else f"{row.change:+.4g} abs"
        lines.append(
            f"  {row.task or '(score)':<24} {row.score:>10.4f} {row.baseline:>10.4f} "
            f"{change:>9} {100 * row.limit:>6.2f} %  {'ok' if row.passed else 'FAIL'}"
        )
    return "\n".join(lines)
