"""Bad cases: from two evaluation runs, the prompts where they disagree, best lead first.

Step 3 of the localization workflow: once one prompt reproduces the difference, the rest is a
single-case problem. Records are matched by ``id`` (or by prompt when a side has no ids) and
ranked so the first case is the easiest to localize: a disagreement on the very first token
that also lost score, then either of the two, then the biggest score loss, then the earliest
divergence.

A record is a mapping with ``prompt``, ``answer`` (text) and/or ``ids`` (generated token ids),
and optionally ``id`` and ``score``; a run is a list of records or a ``.jsonl`` / ``.json``
file of them (JSON: a list, or an object with a ``results`` list).
"""

from __future__ import annotations

import json
import math
import numbers
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._errors import PrecisionInputError
from ._common import OutputCheckFailed, as_int_list, read_text

#: Text answers are compared word by word: runs of ASCII letters / digits, or any single other
#: non-space character (each Chinese character is one unit).
_WORDS = re.compile(r"[A-Za-z0-9_]+|\S")
_ID_KEYS = ("ids", "output_ids", "token_ids")


@dataclass(frozen=True)
class BadCase:
    """One prompt the runs disagree on. ``position`` is the first differing token (word, for
    text answers), None where only the scores differ."""

    key: str
    prompt: str | None
    golden_answer: Any
    target_answer: Any
    golden_score: float | None
    target_score: float | None
    position: int | None
    golden_token: Any
    target_token: Any
    reason: str

    @property
    def score_loss(self) -> float:
        if self.golden_score is None or self.target_score is None:
            return 0.0
        return self.golden_score - self.target_score

    @property
    def first_token(self) -> bool:
        return self.position == 0


@dataclass(frozen=True)
class BadCases:
    """The disagreeing cases, ranked; and what could not be matched."""

    cases: tuple[BadCase, ...]
    matched: int
    only_golden: tuple[str, ...]
    only_target: tuple[str, ...]
    matched_by: str

    @property
    def passed(self) -> bool:
        return not self.cases


def read_results(source: Any, side: str = "results") -> list[Mapping[str, Any]]:
    """A run's records from a list of mappings or a ``.jsonl`` / ``.json`` file."""
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        text = read_text(path)
        try:
            if path.suffix == ".jsonl" or (path.suffix != ".json" and "\n{" in text.strip()):
                records: Any = [json.loads(line) for line in text.splitlines() if line.strip()]
            else:
                records = json.loads(text)
        except json.JSONDecodeError as exc:
            raise PrecisionInputError(f"{path}: malformed JSON: {exc}") from None
        if isinstance(records, Mapping) and isinstance(records.get("results"), list):
            records = records["results"]
        side = str(path)
    else:
        records = source
    if isinstance(records, (str, bytes)) or not isinstance(records, Sequence):
        raise PrecisionInputError(f"{side}: expected a list of records")
    for i, record in enumerate(records):
        if not isinstance(record, Mapping):
            raise PrecisionInputError(f"{side}: record {i} is a {type(record).__name__}")
        if not any(k in record for k in ("answer", *_ID_KEYS, "score")):
            raise PrecisionInputError(f"{side}: record {i} has no answer, ids or score")
    return list(records)


def _answer(record: Mapping[str, Any], where: str) -> tuple[Any, list[Any] | None]:
    """The answer as shown, and the units it is compared by (ids, or words of the text)."""
    for key in _ID_KEYS:
        if key in record:
            ids = as_int_list(record[key], f"{where}.{key}")
            return record.get("answer", ids), ids
    answer = record.get("answer")
    if answer is None:
        return None, None
    if not isinstance(answer, str):
        raise PrecisionInputError(f"{where}.answer: expected text, got {type(answer).__name__}")
    return answer, _WORDS.findall(answer)


def _score(record: Mapping[str, Any], where: str) -> float | None:
    value = record.get("score")
    if value is None:
        return None
    if isinstance(value, bool):
        return float(value)
    if not isinstance(value, numbers.Real) or math.isnan(float(value)):
        raise PrecisionInputError(f"{where}.score: expected a number, got {value!r}")
    return float(value)


def _index(records: list[Mapping[str, Any]], by: str, side: str) -> dict[str, Mapping[str, Any]]:
    index: dict[str, Mapping[str, Any]] = {}
    for i, record in enumerate(records):
        if by not in record:
            raise PrecisionInputError(f"{side}: record {i} has no {by!r} to match it by")
        key = str(record[by])
        if key in index:
            raise PrecisionInputError(
                f"{side}: {by} {key!r} appears twice (records are matched by it)"
            )
        index[key] = record
    return index


def pick_badcases(
    golden_results: Any,
    target_results: Any,
    *,
    by: str | None = None,
    limit: int | None = None,
    score_tol: float = 0.0,
) -> BadCases:
    """The records where the target run disagrees with the golden run, ranked.

    ``by`` is the field records are matched by (default ``id`` when every record has one,
    else ``prompt``). A case disagrees when the answers differ (ids token by token, text word
    by word) or the scores differ by more than ``score_tol``. ``limit`` keeps the first N.
    """
    golden = read_results(golden_results, "golden_results")
    target = read_results(target_results, "target_results")
    if by is None:
        by = "id" if all("id" in r for r in (*golden, *target)) else "prompt"
    g_index, t_index = _index(golden, by, "golden_results"), _index(target, by, "target_results")
    cases = []
    for key, g in g_index.items():
        t = t_index.get(key)
        if t is None:
            continue
        case = _case(key, g, t, score_tol)
        if case is not None:
            cases.append(case)
    cases.sort(key=_rank)
    return BadCases(
        tuple(cases[:limit] if limit is not None else cases),
        sum(1 for k in g_index if k in t_index),
        tuple(k for k in g_index if k not in t_index),
        tuple(k for k in t_index if k not in g_index),
        by,
    )


def _case(key: str, g: Mapping[str, Any], t: Mapping[str, Any], score_tol: float) -> BadCase | None:
    g_answer, g_units = _answer(g, f"golden[{key!r}]")
    t_answer, t_units = _answer(t, f"target[{key!r}]")
    g_score, t_score = _score(g, f"golden[{key!r}]"), _score(t, f"target[{key!r}]")
    position = g_tok = t_tok = None
    if g_units is not None and t_units is not None:
        common = min(len(g_units), len(t_units))
        position = next((i for i in range(common) if g_units[i] != t_units[i]), None)
        if position is None and len(g_units) != len(t_units):
            position = common
        if position is not None:
            g_tok = g_units[position] if position < len(g_units) else None
            t_tok = t_units[position] if position < len(t_units) else None
    scores_differ = (
        g_score is not None and t_score is not None and abs(g_score - t_score) > score_tol
    )
    if position is None and not scores_differ:
        return None
    parts = []
    if position is not None:
        unit = "token" if any(k in g for k in _ID_KEYS) else "word"
        parts.append(f"answers differ from {unit} {position}: {g_tok!r} vs {t_tok!r}")
    if g_score is not None and t_score is not None and g_score != t_score:
        parts.append(f"score {g_score:g} -> {t_score:g}")
    prompt = g.get("prompt")
    return BadCase(
        key=key,
        prompt=None if prompt is None else str(prompt),
        golden_answer=g_answer,
        target_answer=t_answer,
        golden_score=g_score,
        target_score=t_score,
        position=position,
        golden_token=g_tok,
        target_token=t_tok,
        reason="; ".join(parts),
    )


def _rank(case: BadCase) -> tuple[int, float, float]:
    lost = case.score_loss > 0
    tier = 0 if case.first_token and lost else 1 if case.first_token or lost else 2
    position = math.inf if case.position is None else case.position
    return tier, -case.score_loss, position


class BadCasesFound(OutputCheckFailed):
    """:func:`assert_no_badcases` failed; ``result`` is the :class:`BadCases`."""


def assert_no_badcases(golden_results: Any, target_results: Any, **options: Any) -> BadCases:
    """Assert the two runs agree on every matched record (see :func:`pick_badcases`)."""
    __tracebackhide__ = True
    result = pick_badcases(golden_results, target_results, **options)
    if not result.passed:
        raise BadCasesFound(badcases_message(result), result)
    return result


def badcases_message(result: BadCases, *, limit: int = 10) -> str:
    """The assert form's message: the ranked cases, best lead first."""
    lines = [
        f"{len(result.cases)} of {result.matched} matched case(s) disagree (matched by "
        f"{result.matched_by}); localize the first:"
    ]
    for i, case in enumerate(result.cases[:limit], start=1):
        prompt = "" if case.prompt is None else f" {case.prompt[:60]!r}"
        lines.append(f"  {i}. {case.key}{prompt}: {case.reason}")
    if len(result.cases) > limit:
        lines.append(f"  ... and {len(result.cases) - limit} more")
    return "\n".join(lines)
