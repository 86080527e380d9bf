"""What a dump comparison found, as data: record comparisons, the divergence, unmatched calls.

Renderers in :mod:`pytest_precision.report` take these (``render(result)``, ``write_json``,
``write_csv``); a result never imports its renderer.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Literal

from ..dump._layouts import MergedLayouts
from ..dump._records import Dump
from ..numerics._comparison import TensorComparison

#: ``model.layers.3``, ``transformer.h.3``, ``encoder.layer.3``, ``blocks.3``: the layer a module
#: path belongs to.
_LAYER = re.compile(r"^(.*?\b(?:layers|layer|h|blocks|block)\.\d+)(?:\.|$)")


Status = Literal["pass", "warn", "fail", "skip"]


Cause = Literal["source", "wiring", "unmatched", "output", "rerun", "amplification", "stomp"]


#: The rule that convicted (``docs/compare.md``): an input from nowhere differs; an input is
#: another call's output than in the golden; code only one run has changed what leaves its
#: module; an op with exactly matching inputs; a module with exactly matching inputs and
#: weights whose output differs beyond reordered rounding; a float64 rerun from the call's own
#: inputs; a drift the call amplified (weak); a tensor changed between its producer's record
#: and its consumer's with no recorded write (a stomp: the consumer is not to blame).
Rule = Literal[
    "source",
    "wiring",
    "code only one run has",
    "clean inputs",
    "module with clean inputs",
    "float64 rerun",
    "amplification",
    "stomp",
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
    #: not compared element by element: tensors of different shapes, a tensor on one side
    #: only, a slot only one side has
    incomparable: bool = False

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


@dataclass(frozen=True)
class ParameterDifference:
    """A module parameter the two dumps disagree on: ``golden_shape`` or ``target_shape`` is
    None where only the other dump has it."""

    name: str
    rank: int
    golden_shape: tuple[int, ...] | None
    target_shape: tuple[int, ...] | None


@dataclass(frozen=True)
class ModelMismatch:
    """The dumps are of different models: ``differing`` of the ``compared`` parameters (by
    rank and name, in either dump) are on one side only or of another shape."""

    differing: tuple[ParameterDifference, ...]
    compared: int

    def to_dict(self) -> dict[str, object]:
        """JSON-ready: the counts and every differing parameter."""
        return {
            "compared": self.compared,
            "differing": [
                {
                    "name": d.name,
                    "rank": d.rank,
                    "golden_shape": None if d.golden_shape is None else list(d.golden_shape),
                    "target_shape": None if d.target_shape is None else list(d.target_shape),
                }
                for d in self.differing
            ],
        }


@dataclass(frozen=True)
class DerivedInput:
    """A failing input with no recorded producer, matched to a recorded output it was made of
    by calls the dump does not record (a view, cast or slice): it inherits that output's
    error and is no source."""

    name: str
    slot: str
    rank: int
    step: int
    #: the output and the rule that matched it
    derived: str


@dataclass(frozen=True)
class PermutedCall:
    """A call paired with the golden's by content, against the order of the two runs:
    independent calls made in another order (a loop over a ``set``). Information, not a
    difference."""

    golden: str
    target: str
    module: str | None
    rank: int
    step: int


@dataclass(frozen=True)
class PaddingLeftOut:
    """How many (batch, position) entries the comparison left out, of how many (the padded
    forward with the most pad positions)."""

    positions: int
    of: int

    @property
    def line(self) -> str:
        return f"padding: {self.positions} of {self.of} positions left out (attention mask)"


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
    #: set when the dumps are of different models (their parameters differ in name or
    #: shape beyond a few): nothing was judged
    different_models: ModelMismatch | None = None

    #: calls paired by content where the runs made independent calls in another order
    permuted: list[PermutedCall] = field(default_factory=list)
    #: failing inputs without a recorded producer that inherit a recorded output's error
    derived: list[DerivedInput] = field(default_factory=list)

    #: set when the dumps have different numbers of ranks: how both became one logical run
    layouts: MergedLayouts | None = None
    #: set when both dumps padded a forward alike: the pad positions left out of the records
    padding: PaddingLeftOut | None = None

    @property
    def complete(self) -> bool:
        """Both dumps hold the same decode steps and ranks, and some calls were aligned."""
        return self.matched_calls > 0 and not self.one_sided

    @property
    def verdict(
        self,
    ) -> Literal["pass", "divergence", "inconclusive", "incomplete", "different-models"]:
        """``different-models``: the dumps are of different models (nothing judged);
        ``divergence``: a call is guilty; ``incomplete``: steps, ranks or every call of one
        dump had no counterpart; ``inconclusive``: records differ and some drifting calls could
        not be rerun to clear them; ``pass`` otherwise (identical, or noise)."""
        if self.different_models is not None:
            return "different-models"
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


def evidence(
    outputs: list[RecordComparison], *, alike_elsewhere: bool = False
) -> list[RecordComparison]:
    """What leaves a module that tells whether it computes what the golden's does: the
    outputs the two runs put out alike (same slot, tensor and shape), when there are any among
    ``outputs`` or elsewhere (``alike_elsewhere``: an output not given here is). An output of
    another shape or on one side only (a static cache's keys over its padded length, attention
    weights a fused kernel does not return) is the other code's, not evidence."""
    if alike_elsewhere or any(not r.incomparable for r in outputs):
        return [r for r in outputs if not r.incomparable]
    return outputs


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
