"""``assert_same_generation``: a test's generation against its golden, diagnosed on failure.

The workflow lives in ``diagnosis/``, the page and the message in ``report/``; the assertion
reads the running test's golden, so it lives with the plugin. Imported lazily (torch).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from .._errors import PrecisionError
from ..diagnosis._generation import RUN_FILE, SavedRun, save_run
from ..diagnosis._results import Diagnosis
from ..diagnosis._stop import NOISE_FACTOR
from ..diagnosis._workflow import diagnose as run_diagnosis
from ..golden._active import active_factory
from ..golden._sources import GoldenDirectory
from ..output._common import OutputCheckFailed
from ..output._tokens import TIE_MARGIN
from ..report._diagnosis import diagnosis_text
from ..report._html import diagnosis_html


class GenerationDiffers(OutputCheckFailed):
    """:func:`assert_same_generation` failed; ``result`` is the :class:`Diagnosis`."""


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
    :func:`pytest_precision.diagnose`). On failure the message is the diagnosis: culprit op,
    layer, verdict, report and exported test. Without ``out`` the diagnosis goes to a temporary
    folder, removed when the assertion passes and kept (the message names it) when it fails.

    ``golden`` is a model, a :func:`save_run` folder, or None: the run stored for this test
    under ``--golden-dir`` (a folder written on another machine, or the golden dir itself when
    it is a saved run); ``--golden-update`` (re)records it from ``target``. ``cache``: the
    generation path, as in :func:`pytest_precision.diagnose`.
    """
    __tracebackhide__ = True
    if golden is None:
        stored, update = _stored_golden(name)
        assert stored is not None
        if update:
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
    folder = Path(tempfile.mkdtemp(prefix="precision-diagnosis-")) if out is None else Path(out)
    d = run_diagnosis(
        golden,
        target,
        input_ids,
        attention_mask=attention_mask,
        max_new_tokens=max_new_tokens,
        out=folder,
        tie_margin=tie_margin,
        noise_factor=noise_factor,
        cache=cache,
        render=diagnosis_html,
    )
    if d.finding == "tokens":
        raise GenerationDiffers(diagnosis_text(d), d)
    if out is None:
        shutil.rmtree(folder, ignore_errors=True)
    return d
