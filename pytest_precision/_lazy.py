"""Names of a package imported on first use (PEP 562), so that importing the package imports
none of its heavy dependencies (torch, numpy, safetensors).

A package lists its public names once, as a table ``{module: names}`` (``_MODULES``); its
``__all__``, ``__getattr__`` and ``__dir__`` all derive from that table (:func:`exports`). The
``TYPE_CHECKING`` imports that type checkers read repeat the table as imports, and
``tests/architecture/test_public_api.py`` checks the two agree in every package.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_getattr(namespace: dict[str, Any], module_of: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for the package whose globals are ``namespace``: ``name`` comes
    from the module ``module_of[name]`` (relative to the package), imported then, and is kept
    in ``namespace`` so that later lookups skip the function."""
    package = namespace["__name__"]

    def __getattr__(name: str) -> Any:
        module = module_of.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, package), name)
        namespace[name] = value
        return value

    return __getattr__


def exports(
    namespace: dict[str, Any], modules: Mapping[str, tuple[str, ...]], *eager: str
) -> tuple[list[str], Callable[[str], Any], Callable[[], list[str]]]:
    """``__all__``, ``__getattr__`` and ``__dir__`` of the package whose globals are
    ``namespace`` and whose public names are ``modules`` (``{module: names}``, modules relative
    to the package), plus the ``eager`` names it defines itself."""
    module_of = {name: module for module, names in modules.items() for name in names}
    public = sorted({*module_of, *eager})

    def __dir__() -> list[str]:
        return sorted({*namespace, *public})

    return public, lazy_getattr(namespace, module_of), __dir__
