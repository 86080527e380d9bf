"""What :func:`diagnose` found, as data; renderers in ``report/`` take it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from ..compare._results import Divergence, DumpComparison
    from ..output._tokens import TokenComparison
    from ..replay._verdict import ReplayResult
    from ..runtime._environment import ChecklistDiff

#: ``no difference``: tokens equal and logprobs within the tolerance (or a near tie);
#: ``logprobs``: same tokens, logprobs differ beyond rounding; ``tokens``: a token flipped.
Finding = Literal["no difference", "logprobs", "tokens"]


@dataclass(frozen=True)
class DiagnosisStep:
    """One step of the workflow and what it found, in one line."""

    name: str
    finding: str


@dataclass(frozen=True)
class WeightChange:
    """A parameter whose fingerprint differs between the two sides (or that one side lacks)."""

    name: str
    statistic: str
    golden: object
    target: object


@dataclass(frozen=True)
class Diagnosis:
    """The result of :func:`diagnose`.

    ``first_token``: per row, the position (in the generated tokens) of the first divergent
    token, None where the row's tokens are equal. ``divergence``: the dump comparison's first
    divergence (None when nothing was localized). ``replay``: the culprit op replayed on the
    target's device (``replays``: on every available device). ``report``: the HTML page.
    ``steps``: which step found what, in order.
    """

    finding: Finding
    first_token: tuple[int | None, ...]
    tokens: TokenComparison
    golden_tokens: tuple[tuple[int, ...], ...]
    target_tokens: tuple[tuple[int, ...], ...]
    #: the decode step that was captured and compared (0 is the prefill), None if none was
    step: int | None
    comparison: DumpComparison | None
    divergence: Divergence | None
    replay: ReplayResult | None
    replays: tuple[ReplayResult, ...]
    exported_test: Path | None
    report: Path | None
    config_diff: ChecklistDiff | None
    environment_diff: ChecklistDiff | None
    weight_changes: tuple[WeightChange, ...]
    steps: tuple[DiagnosisStep, ...]
    out: Path

    @property
    def passed(self) -> bool:
        """Tokens and logprobs agree within the token checks' rules."""
        return self.finding == "no difference"

    @property
    def culprit(self) -> str | None:
        """The guilty call's name, when one was found."""
        return None if self.divergence is None else self.divergence.name

    def summary(self) -> str:
        """One line per step: what it found."""
        return "\n".join(f"{s.name}: {s.finding}" for s in self.steps)
