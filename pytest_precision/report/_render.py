"""The renderers' public entry points: a result (data from any stage) in, text or a file out.

Results never import their renderers, so a result has no ``report()`` method: pass it here
(``render(compare_dumps(a, b))``); the plugin and the CLI do the same.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .._errors import PrecisionInputError
from ..compare._results import DumpComparison
from ..diagnosis._results import Diagnosis
from ..output._badcases import BadCases
from ..output._scores import ScoreCheck
from ..output._tokens import TokenComparison
from ..output._weights import WeightsReport
from ..replay._verdict import ReplayResult
from ..runtime._environment import ChecklistDiff
from ._diagnosis import diagnosis_text
from ._dumps import dump_comparison_text, write_dump_comparison_csv, write_dump_comparison_json
from ._html import diagnosis_html, dump_comparison_html
from ._output import badcases_text, diff_text, scores_text, tokens_text, weights_text
from ._replay import replay_text


def render(result: Any, *, worst: int = 5) -> str:
    """The terminal text of ``result``: a dump comparison (what was compared, the first
    divergence, the ``worst`` worst records), a replay, a diagnosis, or an output check's result."""
    if isinstance(result, DumpComparison):
        return dump_comparison_text(result, worst=worst)
    if isinstance(result, ReplayResult):
        return replay_text(result)
    if isinstance(result, Diagnosis):
        return diagnosis_text(result)
    if isinstance(result, TokenComparison):
        return tokens_text(result)
    if isinstance(result, ScoreCheck):
        return scores_text(result)
    if isinstance(result, WeightsReport):
        return weights_text(result)
    if isinstance(result, ChecklistDiff):
        return diff_text(result)
    if isinstance(result, BadCases):
        return badcases_text(result)
    raise PrecisionInputError(f"render: no text form for a {type(result).__name__}")


def render_html(result: DumpComparison | Diagnosis) -> str:
    """A self-contained HTML page of a dump comparison or a diagnosis."""
    if isinstance(result, DumpComparison):
        return dump_comparison_html(result)
    return diagnosis_html(result)


def write_json(result: DumpComparison, path: str | os.PathLike[str]) -> None:
    """A dump comparison as JSON: the verdict, the divergence and one entry per record."""
    write_dump_comparison_json(result, Path(path))


def write_csv(result: DumpComparison, path: str | os.PathLike[str]) -> None:
    """A dump comparison as CSV: one row per record, for a spreadsheet."""
    write_dump_comparison_csv(result, Path(path))
