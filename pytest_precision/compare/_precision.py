"""``RunPrecision``: how the target's floating dtypes relate to the golden's.

A bf16 port of an fp32 reference changes every dtype on purpose; the judge must neither fail
that change nor judge bf16 data by fp32's standard.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from ..dump._records import Call
from ..numerics._dtypes import dtype_from_name, lower_precision

#: ops whose ``input.1`` is a weight
_WEIGHTED = frozenset({"linear", "embedding"})


@dataclass(frozen=True)
class RunPrecision:
    """How the target's floating dtypes relate to the golden's, learned from the weights: a
    module's parameters, else the weight an op receives (``linear``'s, ``embedding``'s), else
    all tensors: ``float32 -> bfloat16`` for a bf16 port of an fp32 reference, ``float32 ->
    float32`` for the same dtype on two devices. Not from all tensors where weights are
    known: a bf16 port of Gemma3 computes its norms, rotary and softmax in float32."""

    golden: torch.dtype | None = None
    target: torch.dtype | None = None

    @classmethod
    def learn(cls, pairs: Iterable[tuple[Call, Call]]) -> RunPrecision:
        weights: Counter[tuple[torch.dtype, torch.dtype]] = Counter()
        op_weights: Counter[tuple[torch.dtype, torch.dtype]] = Counter()
        tensors: Counter[tuple[torch.dtype, torch.dtype]] = Counter()
        for golden, target in pairs:
            golden_slots = {r.slot: r for r in golden.records}
            for t in target.records:
                g = golden_slots.get(t.slot)
                if g is None or not (g.is_tensor and t.is_tensor):
                    continue
                pair = dtype_from_name(g.dtype), dtype_from_name(t.dtype)
                if not (pair[0].is_floating_point and pair[1].is_floating_point):
                    continue
                if t.slot.startswith("parameters"):
                    weights[pair] += 1
                elif target.op in _WEIGHTED and t.slot == "input.1":
                    op_weights[pair] += 1
                else:
                    tensors[pair] += 1
        counts = weights or op_weights or tensors
        if not counts:
            return cls()
        (golden_dtype, target_dtype), _ = counts.most_common(1)[0]
        return cls(golden_dtype, target_dtype)

    @property
    def crosses(self) -> bool:
        """The target runs in another precision than the golden."""
        return self.golden != self.target

    def judging_dtype(self, golden: torch.dtype, target: torch.dtype) -> torch.dtype:
        """The dtype whose standard judges a pair: the lower precision of the two, and never
        more than the run's (bf16 data that a bf16 run upcast to fp32 is still bf16 data)."""
        dtype = lower_precision(golden, target)
        if self.crosses and self.golden and self.target and dtype.is_floating_point:
            dtype = lower_precision(dtype, lower_precision(self.golden, self.target))
        return dtype

    def expects(self, golden: torch.dtype, target: torch.dtype) -> bool:
        """A floating dtype pair the run explains: equal, or the run's own change."""
        return golden == target or (golden, target) == (self.golden, self.target)
