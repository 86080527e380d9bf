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
    from ._noise import NoiseEstimate

#: ``no difference``: tokens equal (or part at a tie within noise) and logprobs within the
#: golden's measured noise; ``logprobs``: same tokens, logprobs beyond the noise; ``tokens``: a
#: token flipped (not a tie within noise); ``weights``: logits within noise, but a parameter
#: differs; ``config``: logits within noise, but the config differs (not localized).
Finding = Literal["no difference", "logprobs", "tokens", "weights", "config"]


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
    #: the golden side's own error per row and step, that the stop rule holds the target to
    noise: NoiseEstimate | None = None
    #: the module owning a differing parameter, named when the dump comparison localized none
    weight_culprit: str | None = None
    #: generated on the models' cached path (``generate``, KV cache), else by full forwards
    cached: bool = False

    @property
    def passed(self) -> bool:
        """Tokens and logprobs agree within the golden's noise, and no weight or config
        differs."""
        return self.finding == "no difference"

    @property
    def culprit_module(self) -> str | None:
        """The module to look at: the guilty call's, else the one owning a differing weight."""
        if self.divergence is not None and self.divergence.module is not None:
            return self.divergence.module
        return self.weight_culprit

    @property
    def culprit(self) -> str | None:
        """The guilty call's name, when one was found."""
        return None if self.divergence is None else self.divergence.name

    def summary(self) -> str:
        """One line per step: what it found."""
        return "\n".join(f"{s.name}: {s.finding}" for s in self.steps)
