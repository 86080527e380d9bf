"""The golden assertion used inside tests: the running test's :class:`Golden`, called.

Apart from :mod:`._golden` (the class) so each stays readable; the plugin builds the golden.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .._errors import PrecisionError
from ..numerics._assertions import Comparison
from ..numerics._standards import Standard
from ._active import active_factory
from ._golden import Golden


def record_command(test_id: str, golden_dir: Path, invocation_dir: Path) -> str:
    """The exact command line that records a test's goldens."""
    try:
        shown = golden_dir.relative_to(invocation_dir)
    except ValueError:
        shown = golden_dir
    return (
        f"python -m pytest {shlex.quote(test_id)} --golden-dir {shlex.quote(str(shown))} "
        "--golden-update"
    )


def current_golden() -> Golden:
    """The running test's :class:`Golden` (the pytest plugin activates one per test)."""
    __tracebackhide__ = True
    factory = active_factory()
    if factory is None:
        raise PrecisionError(
            "assert_close_to_golden() runs inside a pytest test with the pytest-precision "
            "plugin (goldens are named after the test); outside pytest use "
            "Golden(golden_dir, test_id)(value, name)"
        )
    return factory()


def assert_close_to_golden(
    value: Any,
    name: str | None = None,
    *,
    standard: Standard | str | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    reference: Any = None,
    envelope: str | None = None,
    perturbations: Sequence[Callable[[], Any]] = (),
    mask: Any = None,
) -> Comparison | None:
    """Assert that ``value`` is close to the running test's golden ``name``.

    Without ``name`` the golden is named after the call's position in the test (``#0``, ``#1``,
    ...); give one to keep it stable across edits. Tolerances: this call's, else the test's
    ``@pytest.mark.precision``, else the ini ``precision_tolerances`` for the dtype, else the
    golden's stored noise envelope, else the dtype's default standard.

    The envelope is measured when the golden is recorded, so a multi-op value (a layer, the
    logits) passes honest ports and still fails bugs: ``reference`` is the same value computed
    in float64 (a tensor or structure, or a zero-argument callable run only when recording, e.g.
    from :func:`float64_reference`); ``envelope="model"`` marks a multi-op value with nothing
    measured; ``perturbations`` are zero-argument callables rerunning the value on legitimate
    other paths. Returns the :class:`Comparison` (``None`` when recorded).

    ``mask``: a ``(batch, seq)`` tensor of 0 and 1 like ``attention_mask``; every tensor of
    ``value`` (and of its reference and reruns) shaped ``(batch, seq, ...)`` keeps only the
    positions with 1, when recorded and when checked (the golden stores only those), and the
    report counts the positions left out. Padding's outputs are never used by the model and
    follow each dtype's mask constant: they are not evidence.
    """
    __tracebackhide__ = True
    return current_golden()(
        value,
        name,
        standard=standard,
        rtol=rtol,
        atol=atol,
        reference=reference,
        envelope=envelope,
        perturbations=perturbations,
        mask=mask,
    )
