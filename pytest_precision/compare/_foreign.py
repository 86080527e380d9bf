"""Code only one run has, with no recorded module around it: what leaves it is what it feeds.

An op-level dump without module records (msprobe's L1) cannot say which module code only the
target runs belongs to: an exact GELU the target calls where the golden spells the tanh
formula out in seven ``mul`` / ``tanh`` / ``add`` calls. Held to the model's last output, its
difference is washed out by the time it gets there. But the foreign code is a module of its own
(the calls between the recorded outputs it reads and the recorded call that reads what it put
out): when everything it read is exactly the golden's, the input it feeds is what leaves it,
and is held to reordered rounding like any module's output.
"""

from __future__ import annotations

from ..dump._records import Call, Record
from ._derivation import is_floating
from ._provenance import Provenance, fingerprint_of


def received_exactly(provenance: Provenance, call: Call, clean: set[str]) -> bool:
    """Whether every floating tensor ``call`` (a call only the target makes) read is an
    output, recorded and compared, that matched the golden's exactly (and inherited no drift),
    or the output of an earlier such call in ``clean``. An input from nowhere (a weight, a
    constant) is not known to be the golden's: no claim."""
    tensors = [r for r in call.inputs if r.is_tensor and is_floating(r)]
    return bool(tensors) and all(_exact(provenance, call.rank, r, clean) for r in tensors)


def _exact(provenance: Provenance, rank: int, record: Record, clean: set[str]) -> bool:
    produced = provenance.producers(rank, record)
    if produced:
        inherited = provenance.inherited.get((rank, fingerprint_of(record)), 0.0)
        return inherited == 0.0 and all(p.error_level == 0.0 for p in produced)
    foreign = provenance.unmatched_producer(rank, record)
    return foreign is not None and foreign[0] in clean
