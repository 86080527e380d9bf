"""Goldens: a test's values stored once (``--golden-update``) and compared in later runs.

``assert_close_to_golden`` and the ``golden`` fixture's ``Golden`` compare a value with the
stored one; ``assert_layers_close_to_golden`` compares a model's layers with a stored dump;
``float64_reference`` reruns a function in float64 for a reference. Names load on first use.
"""

from __future__ import annotations

import typing

from .._lazy import exports

if typing.TYPE_CHECKING:
    from ._assert import assert_close_to_golden
    from ._golden import Golden
    from ._layers import assert_layers_close_to_golden
    from ._reference import float64_reference

#: Each public name and the module it lives in: the one list of this package's surface.
_MODULES = {
    "._assert": ("assert_close_to_golden",),
    "._golden": ("Golden",),
    "._layers": ("assert_layers_close_to_golden",),
    "._reference": ("float64_reference",),
}

__all__, __getattr__, __dir__ = exports(globals(), _MODULES)
