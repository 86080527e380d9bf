"""The pytest plugin: options, markers, fixtures and reports wired to the library.

Hooks appear in pytest's lifecycle order.
"""

from __future__ import annotations

import pytest

from . import _golden_plugin
from ._golden import Golden, current_golden


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("precision", "numerical precision (pytest-precision)")
    # goldens
    _golden_plugin.add_options(parser)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "precision(standard=None, rtol=None, atol=None): tolerance for this test's comparisons",
    )
    # goldens
    config.pluginmanager.register(_golden_plugin.GoldenPlugin(config), _golden_plugin.PLUGIN_NAME)


@pytest.fixture
def golden() -> Golden:
    """This test's goldens: ``golden(value, name=None, *, standard, rtol, atol)`` compares,
    ``golden.load(name)`` reads a stored value."""
    __tracebackhide__ = True
    return current_golden()
