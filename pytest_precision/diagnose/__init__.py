"""diagnose: from "the answer changed" to the culprit op in one call (``docs/diagnose.md``).

This folder shares its name with the public function ``pytest_precision.diagnose``. Importing
the folder makes it an attribute of the package (Python's import system does that), which can
hide the function; so the folder's module is callable and calls the function.
"""

from __future__ import annotations

import sys
import types
from typing import Any


class _Stage(types.ModuleType):
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        import pytest_precision

        return pytest_precision._public("diagnose")(*args, **kwargs)


sys.modules[__name__].__class__ = _Stage
