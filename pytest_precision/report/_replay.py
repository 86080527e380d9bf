"""How a :class:`~pytest_precision.replay._verdict.ReplayResult` reads in a terminal."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._text import shown, shown_text
from ..compare._results import layer_of
from ._dumps import tensor_metrics

if TYPE_CHECKING:
    from ..numerics._comparison import TensorComparison
    from ..replay._verdict import ReplayResult


def replay_text(result: ReplayResult) -> str:
    """The call, where it sits, the verdict and why, then each output slot's three sides."""
    lines = [
        f"replay {shown(result.name)} (step {result.step}, rank {result.rank}) on {result.device}: "
        f"{result.verdict}",
        f"  module:  {shown(result.module or '(top level)')}    layer: "
        f"{shown(layer_of(result.module) or '(none)')}",
        f"  dump:    {shown(result.dump)}"
        + (f"    golden: {shown(result.golden)}" if result.golden else ""),
        f"  reason:  {shown(result.reason)}",
        f"  each output vs a float64 CPU rerun, within {result.precision} rounding:",
    ]
    for slot in result.slots:
        lines.append(f"  {shown(slot.slot)}: {slot.verdict}")
        lines.append(_side("recorded", slot.recorded))
        lines.append(_side(f"rerun on {result.device}", slot.rerun))
        if slot.golden is not None:
            lines.append(_side("golden", slot.golden))
            if slot.golden.verdict != "pass":
                lines.append(
                    "      (reported only, not part of the verdict: the float64 rerun starts "
                    "from the target's recorded inputs, while the golden's output came from the "
                    "golden's own inputs; when those differ upstream, the golden's output differs "
                    f"from this rerun although the op is fine. The verdict, {slot.verdict}, "
                    "judges the target's recorded output and the rerun on the device)"
                )
        elif result.golden is not None:
            lines.append("    golden: no output of this shape in the golden's call")
    return shown_text("\n".join(lines))


def _side(label: str, m: TensorComparison) -> str:
    return f"    {label}: {m.verdict}, {tensor_metrics(m)}"
