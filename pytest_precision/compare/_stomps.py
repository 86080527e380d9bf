"""Stomps: a tensor that changed between the record its producer made and a consumer's read,
with no recorded call writing it (a kernel writing out of bounds, a write through ``.data``).

The consumer computes right from what it read; convicting it (its rerun from the producer's
record fails) points at a kernel that is fine. The evidence, first found first used:

* capture's: a record whose ``changed_since`` names the earlier record the same tensor (version
  counter unmoved) no longer equals. Every record with that content carries the stomp, the
  first consumer judged is where it is reported;
* the dump's own, for dumps without it (msprobe, older native dumps), in a dump that records
  ops: in the golden the consumer read exactly what a recorded call put out, in the target it
  read something that call's counterpart never put out, of the same dtype and shape, and no
  recorded call of the target produced it.

The place reported is the module enclosing both records (``model.layers.1`` for a norm's
output stomped before its ``q_proj``), its layer the one the changed memory was read in.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from ..dump._records import Call, Record, RecordRef
from ._outputs import divergence
from ._provenance import ContentKey, Provenance, fingerprint_of, home
from ._results import Divergence, RecordComparison, is_input, layer_of


class Stomps:
    """Finds the stomp behind a failing input, from capture's evidence or the dump's."""

    def __init__(self, provenance: Provenance, target_calls: Sequence[Call]) -> None:
        self.provenance = provenance
        #: content that capture found changed -> the record it was expected to equal
        self.changed: dict[ContentKey, RecordRef] = {}
        #: the target's calls by (rank, step, name): where a producer runs
        self.calls: dict[tuple[int, int, str], Call] = {}
        for call in target_calls:
            self.calls[(call.rank, call.step, call.name)] = call
            for record in call.records:
                if record.changed_since is None:
                    continue
                if (fingerprint := fingerprint_of(record)) is not None:
                    self.changed.setdefault((call.rank, fingerprint), record.changed_since)

    def find(
        self,
        golden: Call,
        target: Call,
        r: RecordComparison,
        record: Record,
        golden_record: Record | None,
    ) -> Divergence | None:
        """The stomp that explains the failing record ``r`` (``record`` in the target), if any:
        capture's evidence for any slot, the dump's for an input."""
        found = self.captured(golden, target, r, record)
        if found is not None or not is_input(r.slot):
            return found
        since = self._by_content(target, record, golden_record)
        return None if since is None else self._stomp(golden, target, r, since, _BY_CONTENT)

    def captured(
        self, golden: Call, target: Call, r: RecordComparison, record: Record
    ) -> Divergence | None:
        """The stomp capture recorded in ``record``'s content, if any: the record alone
        proves it (a shard's judge needs nothing else)."""
        since = self.changed.get((target.rank, fingerprint_of(record)))
        return None if since is None else self._stomp(golden, target, r, since, _CAPTURED)

    def _stomp(
        self, golden: Call, target: Call, r: RecordComparison, since: RecordRef, how: str
    ) -> Divergence:
        producer = self.calls.get((target.rank, since.step, since.name))
        step = f" (step {since.step})" if since.step != target.step else ""
        reason = (
            f"changed between `{since.name}` {since.slot}{step} and `{target.name}` {r.slot}: "
            f"memory written outside any recorded call ({how}; {r.reason})"
        )
        found = divergence(target, golden, "stomp", reason, r)
        # a module's output is recorded as its call ends, inside it; its inputs as it begins
        reader = target.module if not is_input(r.slot) else home(target)
        place = _enclosing(None if producer is None else home(producer), reader)
        return replace(found, module=place, layer=layer_of(place) or found.layer)

    def _by_content(
        self, target: Call, record: Record, golden_record: Record | None
    ) -> RecordRef | None:
        """The target's output that an input should have equalled, when the dump alone shows
        it changed on the way. Not in a module-level dump (glue code between modules is not
        recorded), nor for a buffer filled slice by slice (no call put it out whole), nor for
        a constant tensor: every norm weight of ones, every zero bias has the same content, so
        "the golden read what that call put out" names a call it never read from."""
        provenance = self.provenance
        if not provenance.op_level or record.memory is not None:
            return None
        if golden_record is None or _constant(golden_record):
            return None
        if provenance.producers(target.rank, record):
            return None
        if provenance.unmatched_producer(target.rank, record) is not None:
            return None
        expected = provenance.counterpart(target.rank, golden_record)
        if (
            expected is None
            or expected.dtype != record.dtype
            or expected.shape != record.shape
            or fingerprint_of(expected) == fingerprint_of(record)
        ):
            return None
        return RecordRef(expected.name, expected.slot, expected.step)


def _constant(record: Record) -> bool:
    stats = record.stats
    return stats is not None and stats.max == stats.min


_CAPTURED = "capture found its content changed with its version counter unmoved"
_BY_CONTENT = (
    "in the golden it reads that output unchanged; no recorded call of the target put out "
    "what it read"
)


def _enclosing(producer: str | None, consumer: str | None) -> str | None:
    """The innermost module path holding both (the consumer's alone when the producer's is
    unknown); ``""`` is the root."""
    if producer is None or consumer is None:
        return consumer if producer is None else producer
    common: list[str] = []
    for a, b in zip(producer.split("."), consumer.split("."), strict=False):
        if a != b:
            break
        common.append(a)
    return ".".join(common)
