"""What a dump comparison found, as data: record comparisons, the divergence, unmatched calls.

Renderers in :mod:`pytest_precision.report` take these; ``DumpComparison.report()`` and its
``write_*`` methods are conveniences that import the renderer when called (the one documented
exception to "results do not import their renderers", ``docs/architecture.md``).
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from ..dump._layouts import MergedLayouts
from ..dump._records import Dump
from ..numerics._comparison import TensorComparison

#: ``model.layers.3``, ``transformer.h.3``, ``encoder.layer.3``, ``blocks.3``: the layer a module
#: path belongs to.
_LAYER = re.compile(r"^(.*?\b(?:layers|layer|h|blocks|block)\.\d+)(?:\.|$)")


Status = Literal["pass", "warn", "fail", "skip"]


Cause = Literal["source", "wiring", "unmatched", "output", "rerun", "amplification"]


#: The rule that convicted (``docs/compare.md``): an input from nowhere differs; an input is
#: another call's output than in the golden; code only one run has changed what leaves its
#: module; an op with exactly matching inputs; a module with exactly matching inputs and
#: weights whose output differs beyond reordered rounding; a float64 rerun from the call's own
#: inputs; a drift the call amplified (weak).
Rule = Literal[
    "source",
    "wiring",
    "code only one run has",
    "clean inputs",
    "module with clean inputs",
    "float64 rerun",
    "amplification",
]


@dataclass(frozen=True)
class StatsComparison:
    """Two statistics summaries compared (a statistics-only dump has nothing else).

    Each difference is relative to the golden's value, but never to less than the golden's
    root mean square (a mean near zero has no useful relative error).
    """

    max_diff: float
    min_diff: float
    mean_diff: float
    norm_diff: float
    non_finite_differs: bool

    @property
    def error_level(self) -> float:
        """The size of the difference as the sums see it (mean, norm): a max or min moves by a
        whole rounding step of one element, which says little about the tensor."""
        return math.inf if self.non_finite_differs else max(self.mean_diff, self.norm_diff)

    @property
    def largest_difference(self) -> float:
        """The largest of the four differences."""
        if self.non_finite_differs:
            return math.inf
        return max(self.max_diff, self.min_diff, self.mean_diff, self.norm_diff)


@dataclass(frozen=True)
class RecordComparison:
    """One slot of one aligned call: the target's record against the golden's."""

    name: str
    golden_name: str
    slot: str
    kind: str
    op: str
    module: str | None
    rank: int
    step: int
    status: Status
    reason: str
    golden_dtype: str | None = None
    target_dtype: str | None = None
    shape: tuple[int, ...] | None = None
    metrics: TensorComparison | StatsComparison | None = None

    @property
    def error_level(self) -> float:
        """Relative size of the difference (relative RMS error for tensors), 0 if identical;
        what drift amplification is measured in."""
        if isinstance(self.metrics, TensorComparison):
            if self.metrics.nonfinite_mismatch_count:  # a NaN or Inf where the other has none
                return math.inf
            sqnr = self.metrics.sqnr_db  # +inf when identical, -inf or nan for a zero signal
            if sqnr == math.inf:
                return 0.0
            return 10 ** (-sqnr / 20) if math.isfinite(sqnr) else math.inf
        if isinstance(self.metrics, StatsComparison):
            return self.metrics.error_level
        return 0.0 if self.status in ("pass", "skip") else math.inf

    @property
    def failed(self) -> bool:
        return self.status == "fail"

    def to_dict(self) -> dict[str, object]:
        """A flat, JSON- and CSV-ready row."""
        row: dict[str, object] = {
            "name": self.name,
            "golden_name": self.golden_name,
            "kind": self.kind,
            "op": self.op,
            "slot": self.slot,
            "module": self.module,
            "rank": self.rank,
            "step": self.step,
            "status": self.status,
            "reason": self.reason,
            "golden_dtype": self.golden_dtype,
            "target_dtype": self.target_dtype,
            "shape": None if self.shape is None else list(self.shape),
            "error_level": _finite_or_text(self.error_level),
        }
        if isinstance(self.metrics, TensorComparison):
            m = self.metrics
            for key in ("cosine", "max_abs_err", "max_rel_err", "rmse", "sqnr_db"):
                row[key] = _finite_or_text(getattr(m, key))
            row["thousandth_ratio"] = m.thousandth_ratio
            row["max_abs_index"] = list(m.max_abs_index) if m.max_abs_index else None
        elif isinstance(self.metrics, StatsComparison):
            for key in ("max_diff", "min_diff", "mean_diff", "norm_diff"):
                row[key] = _finite_or_text(getattr(self.metrics, key))
        return row


@dataclass(frozen=True)
class Divergence:
    """Where the target started to go wrong: the guilty call, its module and layer, and why."""

    name: str
    golden_name: str
    module: str | None
    layer: str | None
    rank: int
    step: int
    cause: Cause
    reason: str
    #: the failing record that convicts the call (an output, or the drifting source input)
    record: RecordComparison
    #: the rule that convicted
    rule: Rule
    #: how the error grew after the culprit, layer by layer
    growth: ErrorGrowth | None = None
    #: when the dumps have different parallel layouts: the target's ranks whose piece of the
    #: convicting record differs (every rank of a partial sum)
    ranks: tuple[int, ...] = ()

    @property
    def metrics(self) -> TensorComparison | StatsComparison | None:
        return self.record.metrics


@dataclass(frozen=True)
class LayerError:
    """The error level of what left one layer (or a top-level module) after the culprit."""

    layer: str
    step: int
    #: the call whose output is the layer's output
    name: str
    error_level: float


@dataclass(frozen=True)
class ErrorGrowth:
    """The error after the culprit, layer by layer on the culprit's rank: where it starts
    and where it first exceeds ``gross`` (the dtype's gross-error limit: the output is no
    longer the golden's within any precision's tolerance)."""

    layers: tuple[LayerError, ...]
    gross: float

    @property
    def explodes(self) -> LayerError | None:
        """The first layer whose output error exceeds the gross limit."""
        return next((x for x in self.layers if x.error_level > self.gross), None)

    def to_dict(self) -> dict[str, object]:
        """JSON-ready: the limit, where it is first exceeded, every layer."""
        explodes = self.explodes
        return {
            "gross": self.gross,
            "explodes": None if explodes is None else explodes.layer,
            "layers": [
                {**vars(x), "error_level": _finite_or_text(x.error_level)} for x in self.layers
            ],
        }


@dataclass(frozen=True)
class UnmatchedCall:
    """A call one dump has and the other does not (an added, removed or fused op)."""

    side: Literal["golden", "target"]
    name: str
    module: str | None
    rank: int
    step: int


@dataclass
class DumpComparison:
    """The result of :func:`compare_dumps`."""

    golden: Dump
    target: Dump
    records: list[RecordComparison]
    first_divergence: Divergence | None
    unmatched: list[UnmatchedCall] = field(default_factory=list)
    matched_calls: int = 0
    #: calls whose inputs drifted and outputs failed that could not be rerun: judged innocent
    #: because they did not amplify the drift, not because a rerun cleared them
    unverified: list[str] = field(default_factory=list)
    #: (side, step, rank, calls) of each decode step and rank that only one dump has
    one_sided: list[tuple[str, int, int, int]] = field(default_factory=list)
    #: set when, at a later decode step, the model's inputs differ although every earlier call
    #: was innocent: generation took another token (the steps after it are not judged)
    inputs_diverged: Divergence | None = None
    #: set when the dumps have different numbers of ranks: how both became one logical run
    layouts: MergedLayouts | None = None

    @property
    def complete(self) -> bool:
        """Both dumps hold the same decode steps and ranks, and some calls were aligned."""
        return self.matched_calls > 0 and not self.one_sided

    @property
    def verdict(self) -> Literal["pass", "divergence", "inconclusive", "incomplete"]:
        """``divergence``: a call is guilty; ``incomplete``: steps, ranks or every call of one
        dump had no counterpart; ``inconclusive``: records differ and some drifting calls could
        not be rerun to clear them; ``pass`` otherwise (identical, or noise)."""
        if self.first_divergence is not None:
            return "divergence"
        if not self.complete:
            return "incomplete"
        if self.unverified and self.counts()["fail"]:
            return "inconclusive"
        return "pass"

    @property
    def passed(self) -> bool:
        """No call is guilty, the comparison covered both dumps, and nothing was left unproven."""
        return self.verdict == "pass"

    def counts(self) -> dict[Status, int]:
        out: dict[Status, int] = {"pass": 0, "warn": 0, "fail": 0, "skip": 0}
        for record in self.records:
            out[record.status] += 1
        return out

    def report(self, *, worst: int = 5) -> str:
        """The terminal summary: what was compared, the first divergence, the worst records."""
        from ..report._dumps import dump_comparison_text

        return dump_comparison_text(self, worst=worst)

    def write_json(self, path: str | os.PathLike[str]) -> None:
        from ..report._dumps import write_dump_comparison_json

        write_dump_comparison_json(self, Path(path))

    def write_csv(self, path: str | os.PathLike[str]) -> None:
        from ..report._dumps import write_dump_comparison_csv

        write_dump_comparison_csv(self, Path(path))


def is_input(slot: str) -> bool:
    """A slot the call received: a positional or keyword argument."""
    return slot.startswith(("input", "kwargs"))


def layer_of(module: str | None) -> str | None:
    """The decoder layer a module path belongs to (``model.layers.1`` for its attention's
    ``o_proj``), or ``None`` outside any layer."""
    if module is None:
        return None
    match = _LAYER.match(module)
    return match.group(1) if match else None


def _finite_or_text(value: float) -> float | str:
    return value if math.isfinite(value) else str(value)
