"""Every standard by its name: what ``compare_tensors(standard="ulp")``, a golden's per-dtype
tolerances and the CLI's ``--standard`` resolve. Kept apart from the classes because
``precision_checker`` builds on ``_standards``' base classes and so cannot be imported by it."""

from __future__ import annotations

from ._precision_checker import PrecisionChecker
from ._standards import AllClose, Exact, Ratio, Reference, Standard, Ulp

STANDARDS: dict[str, type[Standard]] = {
    cls.name: cls for cls in (AllClose, Ratio, Ulp, Reference, Exact, PrecisionChecker)
}
