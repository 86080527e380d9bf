"""The worked example: placeholder replaced as capabilities land."""

from __future__ import annotations

import pytest_precision

print(f"pytest-precision {pytest_precision.__version__}")
