"""What the calls judged so far produced, by content: where an input of a later call came from.

A tensor is known by its fingerprint (its checksum, else its exact statistics) within one rank
of one dump, so an input can be traced to the call that produced it, to a call only one run
makes, or to nowhere (a weight, a constant). The error levels remembered here tell a call's
own error from the error it received.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence

from ..dump._records import Call, Record
from ..numerics._stats import TensorStats
from ._derivation import RecordedOutputs
from ._results import RecordComparison, StatsComparison, is_input

#: Content identity within one rank of one dump: (rank, fingerprint).
ContentKey = tuple[int, tuple[object, ...] | None]

#: Ops that allocate memory without writing it.
ALLOCATIONS = frozenset({"empty", "empty_like", "new_empty", "empty_strided"})


class Provenance:
    """Outputs of the calls judged so far, by (rank, content): the target's with how they
    compared, the golden's by (call name, slot). Several calls may produce the same content
    (``x.to(x.dtype)`` returns ``x``). One walks the whole comparison: a KV cache made at one
    step is read at the next."""

    def __init__(self, target_calls: Sequence[Call]) -> None:
        #: ops are recorded, not only modules: a module's output is then its last op's
        self.op_level = any(c.kind != "Module" for c in target_calls)
        self.produced: dict[ContentKey, list[RecordComparison]] = {}
        self.golden_produced: dict[ContentKey, set[tuple[str, str]]] = {}
        #: the golden's outputs by content -> the target's record of the same output (the
        #: aligned call's slot): what a consumer of that content should have read
        self.counterparts: dict[ContentKey, Record] = {}
        #: calls only the golden makes: name -> the module it runs in
        self.golden_only: dict[str, str | None] = {}
        #: outputs of calls only the target makes: content -> (call name, module it runs in)
        self.unmatched_outputs: dict[ContentKey, tuple[str, str | None]] = {}
        #: statistics-only contents whose statistics matched while their producer's inputs or
        #: outputs drifted: the error level they inherit (four statistics miss a permutation)
        self.inherited: dict[ContentKey, float] = {}
        #: the latest outputs with the error they carry: what an unrecorded view or slice of
        #: them, reaching a later call with no recorded producer, inherits
        self.recorded = RecordedOutputs()
        #: the module parameters of the target by content, to name the weight an op received
        self.parameters: dict[ContentKey, str] = {
            (c.rank, fingerprint): join(c.module, r.slot.removeprefix("parameters."))
            for c in target_calls
            for r in c.parameters
            if (fingerprint := fingerprint_of(r)) is not None
        }
        #: (rank, module path) -> the largest error level of parameters inside it
        self.parameter_levels: dict[tuple[int, str], float] = {}
        #: (rank, module path) -> the largest error level that calls inside it produced from
        #: inputs matching exactly and were cleared: rounding born there (another kernel)
        self.noise_origins: dict[tuple[int, str], float] = {}

    # -- remembering -----------------------------------------------------------------------------

    def remember_golden_only(self, calls: Iterable[Call]) -> None:
        """Calls only the golden makes: a target input whose golden counterpart came from one
        of them was wired differently (an op or residual the target lost)."""
        for call in calls:
            self.golden_only[call.name] = home(call)
            self._remember_golden(call)

    def remember_unmatched(self, target: Call) -> None:
        """A call only the target makes: what it produces has no golden counterpart."""
        for record in target.outputs:
            fingerprint = fingerprint_of(record)
            if fingerprint is not None:
                key = (target.rank, fingerprint)
                self.unmatched_outputs.setdefault(key, (target.name, home(target)))

    def remember(self, golden: Call, target: Call, compared: list[RecordComparison]) -> None:
        """What an aligned pair produced, with how the target's outputs compared."""
        if target.kind == "Module" and self.op_level:
            return  # a module's output is its last op's: the op is the producer
        by_slot = {r.slot: r for r in compared}
        received = self.received_level(target, [r for r in compared if is_input(r.slot)])
        for record in target.outputs:
            fingerprint = fingerprint_of(record)
            if fingerprint is not None and record.slot in by_slot:
                key = (target.rank, fingerprint)
                r = by_slot[record.slot]
                self.produced.setdefault(key, []).append(r)
                level = max(received, r.error_level)
                if isinstance(r.metrics, StatsComparison) and level > 0.0:
                    self.inherited[key] = max(self.inherited.get(key, 0.0), level)
                self.recorded.add(record, level)
        targets = {r.slot: r for r in target.outputs}
        for record in golden.outputs:
            fingerprint = fingerprint_of(record)
            if fingerprint is not None and record.slot in targets:
                self.counterparts[(golden.rank, fingerprint)] = targets[record.slot]
        self._remember_golden(golden)

    def _remember_golden(self, golden: Call) -> None:
        if golden.kind == "Module" and self.op_level:
            return
        for record in golden.outputs:
            fingerprint = fingerprint_of(record)
            if fingerprint is not None:
                key = (golden.rank, fingerprint)
                self.golden_produced.setdefault(key, set()).add((golden.name, record.slot))

    def remember_parameter(self, rank: int, r: RecordComparison) -> None:
        """A module's parameter that passed: its error level counts as its module's input."""
        key = (rank, r.module or "")
        self.parameter_levels[key] = max(self.parameter_levels.get(key, 0.0), r.error_level)

    # -- tracing ---------------------------------------------------------------------------------

    def producers(self, rank: int, record: Record) -> list[RecordComparison]:
        """The target's outputs, as compared, that hold this content."""
        return self.produced.get((rank, fingerprint_of(record)), [])

    def golden_producers(self, rank: int, record: Record | None) -> set[tuple[str, str]] | None:
        """The golden's (call name, slot) pairs that produced this content."""
        return self.golden_produced.get((rank, fingerprint_of(record)))

    def counterpart(self, rank: int, golden: Record | None) -> Record | None:
        """The target's record of the aligned output that produced ``golden``'s content."""
        return self.counterparts.get((rank, fingerprint_of(golden)))

    def unmatched_producer(self, rank: int, record: Record) -> tuple[str, str | None] | None:
        """The call only the target makes that produced this content, with its module."""
        return self.unmatched_outputs.get((rank, fingerprint_of(record)))

    def lost_producers(self, expected: set[tuple[str, str]] | None) -> list[tuple[str, str]]:
        """The golden producers of an input, sorted, when every one is a call only the golden
        makes (a call the target lost); else none."""
        if not expected:
            return []
        golden_only = {(name, slot) for name, slot in expected if name in self.golden_only}
        return sorted(expected) if expected <= golden_only else []

    def parameter_name(self, rank: int, record: Record) -> str | None:
        """The target's module parameter with this content (an op's weight input)."""
        return self.parameters.get((rank, fingerprint_of(record)))

    # -- error levels ----------------------------------------------------------------------------

    def input_level(self, target: Call, inputs: list[RecordComparison]) -> float:
        """How far a call's inputs are from the golden's: for a module, the weights inside it
        and the rounding its children introduced count too."""
        level = self.received_level(target, inputs)
        if target.kind == "Module":
            level = max(level, self._inside(self.noise_origins, target))
        return level

    def received_level(self, target: Call, inputs: list[RecordComparison]) -> float:
        """How far what a call received is from the golden's: its inputs (a statistics match
        inherits its producer's drift) and, for a module, the weights inside it."""
        records = {r.slot: r for r in target.records}
        level = 0.0
        for r in inputs:
            own = r.error_level
            if own == 0.0 and isinstance(r.metrics, StatsComparison):
                key = (target.rank, fingerprint_of(records.get(r.slot)))
                own = self.inherited.get(key, 0.0)
            level = max(level, own)
        if target.kind == "Module":
            level = max(level, self._inside(self.parameter_levels, target))
        return level

    def _inside(self, levels: dict[tuple[int, str], float], target: Call) -> float:
        inside = _inside_paths(target.rank, target.module or "")
        return max((v for k, v in levels.items() if inside(k)), default=0.0)

    def note_noise(
        self, target: Call, inputs: list[RecordComparison], compared: list[RecordComparison]
    ) -> None:
        """A call with exactly matching inputs whose outputs differ anyway (within the
        standard, or cleared): another kernel's rounding, born here."""
        outputs = [r.error_level for r in compared if r.slot.startswith("output")]
        level = max(outputs, default=0.0)
        if level == 0.0 or not math.isfinite(level) or self.input_level(target, inputs) > 0.0:
            return
        path = target.module or ""
        while True:
            key = (target.rank, path)
            self.noise_origins[key] = max(self.noise_origins.get(key, 0.0), level)
            if not path:
                return
            path = path.rpartition(".")[0]


def uninitialized_inputs(
    walks: Iterable[Sequence[tuple[Call | None, Call]]],
) -> frozenset[tuple[int, int, str, str]]:
    """The inputs, as (rank, step, call name, slot), holding what an ``empty*`` call returned
    before them (content an allocation returned is not data until something writes it).
    ``walks``: the aligned walks in step order. From the dumps' metadata alone, so that every
    call pair compares the same wherever it is compared."""
    allocated: set[ContentKey] = set()
    out: set[tuple[int, int, str, str]] = set()
    for walk in walks:
        for golden, target in walk:
            if golden is None:
                continue
            if target.op in ALLOCATIONS:
                for record in target.outputs:
                    if (fingerprint := fingerprint_of(record)) is not None:
                        allocated.add((target.rank, fingerprint))
            for record in target.records:
                fingerprint = fingerprint_of(record)
                if is_input(record.slot) and (target.rank, fingerprint) in allocated:
                    out.add((target.rank, target.step, target.name, record.slot))
    return frozenset(out)


def fingerprint_of(record: Record | None) -> tuple[object, ...] | None:
    """Content identity within one dump: checksum where recorded, else exact statistics."""
    if record is None or not record.is_tensor:
        return None
    if record.checksum is not None:
        return (record.dtype, record.shape, record.checksum)
    if record.stats is not None:
        return (record.dtype, record.shape, *_stats_key(record.stats))
    return None


def _stats_key(stats: TensorStats) -> tuple[object, ...]:
    # NaN != NaN: a tensor with no finite element still fingerprints equal to itself
    return tuple(
        "nan" if isinstance(v, float) and math.isnan(v) else v for v in vars(stats).values()
    )


def _inside_paths(rank: int, module: str) -> Callable[[tuple[int, str]], bool]:
    prefix = module + "."
    return lambda key: (
        key[0] == rank and (not module or key[1] == module or key[1].startswith(prefix))
    )


def home(call: Call) -> str | None:
    """The module a call runs in: an op's module, a module call's parent."""
    if call.kind != "Module" or call.module is None:
        return call.module
    return call.module.rpartition(".")[0]


def join(module: str | None, name: str) -> str:
    """A name inside a module: ``layers.0.mlp`` and ``weight`` make ``layers.0.mlp.weight``."""
    return f"{module}.{name}" if module else name
