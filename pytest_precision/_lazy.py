"""Names of a package imported on first use (PEP 562), so that importing the package imports
none of its heavy dependencies (torch, numpy, safetensors)."""

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
