"""``diagnose`` with its HTML report wired in, and ``assert_same_generation`` for tests.

The workflow lives in ``diagnosis/``, the page in ``report/_html``; diagnose may not import
report/, so the public names are assembled here, above both. Imported lazily (torch).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .._errors import PrecisionError
from .._text import shown, shown_text
from ..diagnosis._generation import RUN_FILE, SavedRun, save_run
from ..diagnosis._results import Diagnosis
from ..diagnosis._stop import NOISE_FACTOR
from ..diagnosis._workflow import diagnose as run_diagnosis
from ..golden._active import active_factory
from ..golden._sources import GoldenDirectory
from ..output._common import OutputCheckFailed
from ..output._tokens import TIE_MARGIN
from ..report._html import diagnosis_html


def diagnose(
    golden: Any,
    target: Any,
    input_ids: Any,
    *,
    attention_mask: Any = None,
    max_new_tokens: int = 16,
    out: str | os.PathLike[str] | None = None,
    devices: Iterable[str] | None = None,
    tie_margin: float = TIE_MARGIN,
    noise_factor: float = NOISE_FACTOR,
    cache: bool | None = None,
) -> Diagnosis:
    """From "the answer changed" to the culprit op, with the HTML report at ``.report``.

    ``golden`` and ``target``: models (HF causal LMs or modules returning logits), or for
    either a folder written by :func:`save_run` on another machine. Steps: config, weight and
    environment diffs; greedy generation on both (``cache``: on the models' cached path,
    ``model.generate`` with the KV cache, the default for HF models; False: one full forward per
    step); the first divergent token per row; a capture of both at the step that produces it,
    with the cache that step read (statistics first, then tensors up to the suspect layer);
    ``compare_dumps``; a replay of the culprit op on ``devices`` (default: every available
    one); an exported regression test; the HTML report, all in ``out``. Stops after the tokens
    when tokens and logprobs agree within ``noise_factor`` times the golden's own measured error
    (a float64 rerun) and the checklist found no differing weight. See ``docs/diagnose.md``.
    """
    return run_diagnosis(
        golden,
        target,
        input_ids,
        attention_mask=attention_mask,
        max_new_tokens=max_new_tokens,
        out=out,
        devices=devices,
        tie_margin=tie_margin,
        noise_factor=noise_factor,
        cache=cache,
        render=diagnosis_html,
    )


class GenerationDiffers(OutputCheckFailed):
    """:func:`assert_same_generation` failed; ``result`` is the :class:`Diagnosis`."""


def diagnosis_message(d: Diagnosis) -> str:
    """The failure message: the culprit first, then each step's finding and the files; names
    from the dumps shown with their control characters escaped."""
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
    lines.append(f"report: {d.report}")
    lines.append(f"exported test: {d.exported_test or '-'}")
    return shown_text("\n".join(lines))


def _stored_golden(name: str) -> tuple[Path | None, bool]:
    """The saved run of the running test under ``--golden-dir`` and whether to update it."""
    factory = active_factory()
    if factory is None:
        raise PrecisionError(
            "assert_same_generation(None, ...) reads the golden from --golden-dir inside a "
            "pytest test; outside pytest pass a model or a save_run() folder as golden"
        )
    golden = factory()
    root = Path(golden.source.path)
    if (root / RUN_FILE).is_file():  # the golden dir is itself a run saved elsewhere
        return root, False
    if isinstance(golden.source, GoldenDirectory):
        return golden.source.baseline_for(golden.test_id, name), golden.update
    return Path(f"{golden.location}.{name}.run"), golden.update


def assert_same_generation(
    golden: Any,
    target: Any,
    input_ids: Any,
    *,
    attention_mask: Any = None,
    max_new_tokens: int = 16,
    name: str = "generation",
    out: str | os.PathLike[str] | None = None,
    tie_margin: float = TIE_MARGIN,
    noise_factor: float = NOISE_FACTOR,
    cache: bool | None = None,
) -> Diagnosis:
    """Assert ``target`` generates what ``golden`` does: the same greedy tokens (a tie at the
    first divergence passes when its logprob gap is within the golden's measured noise, see
    :func:`diagnose`). On failure the message is the diagnosis: culprit op, layer, verdict,
    report and exported test.

    ``golden`` is a model, a :func:`save_run` folder, or None: the run stored for this test
    under ``--golden-dir`` (a folder written on another machine, or the golden dir itself when
    it is a saved run); ``--golden-update`` (re)records it from ``target``. ``cache``: the
    generation path, as in :func:`diagnose`.
    """
    __tracebackhide__ = True
    if golden is None:
        stored, update = _stored_golden(name)
        assert stored is not None
        if update:
            import shutil

            if stored.exists():
                shutil.rmtree(stored)
            save_run(
                target,
                input_ids,
                stored,
                attention_mask=attention_mask,
                max_new_tokens=max_new_tokens,
                cache=cache,
            )
        elif not (stored / RUN_FILE).is_file():
            raise PrecisionError(
                f"{stored}: no stored generation for this test; record it with --golden-update"
            )
        try:
            golden = SavedRun(stored)
        except (PrecisionError, OSError) as exc:  # a file of the baseline lost or damaged
            problem = exc.args[0] if isinstance(exc, PrecisionError) else exc
            raise PrecisionError(
                f"stored generation of this test is incomplete or unreadable: {problem}; "
                "record it again with --golden-update"
            ) from None
    d = diagnose(
        golden,
        target,
        input_ids,
        attention_mask=attention_mask,
        max_new_tokens=max_new_tokens,
        out=out,
        tie_margin=tie_margin,
        noise_factor=noise_factor,
        cache=cache,
    )
    if d.finding == "tokens":
        raise GenerationDiffers(diagnosis_message(d), d)
    return d
