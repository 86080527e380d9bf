"""The pytest plugin: options, markers, fixtures and reports wired to the library.

Hooks appear in pytest's lifecycle order.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("precision", "numerical precision (pytest-precision)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "precision(standard=None, rtol=None, atol=None): tolerance for this test's comparisons",
    )
