"""How a :class:`Diagnosis` reads in a terminal: the culprit first, then each step's finding
(the exported test and the HTML page are steps, so each path is said once). Names from the
dumps are shown with their control characters escaped."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._text import shown, shown_text

if TYPE_CHECKING:
    from ..diagnosis._results import Diagnosis


def diagnosis_text(d: Diagnosis) -> str:
    """The culprit (op, module, layer, cause, replay verdict), then one line per step."""
    lines = []
    if d.divergence is not None:
        v = d.divergence
        verdict = "" if d.replay is None else f", replay verdict {d.replay.verdict}"
        lines.append(
            f"culprit: {shown(v.name)} in {shown(v.module or '-')} "
            f"(layer {shown(v.layer or '-')}), cause {v.cause}{verdict}"
        )
    elif d.weight_culprit is not None:
        lines.append(f"culprit: {d.weight_culprit} (a differing weight), cause source")
    else:
        lines.append(f"the generations differ ({shown(d.finding)}); no call was localized")
    lines += [f"  {s.name}: {shown(s.finding)}" for s in d.steps]
    return shown_text("\n".join(lines))
