"""The pytest plugin: options, markers, fixtures and reports wired to the library.

Hooks appear in pytest's lifecycle order. Torch is imported only by a fixture that needs it,
or by the report of devices once the run has torch anyway: having the plugin installed costs a
project that never uses it no torch import ("Startup cost" in docs/architecture.md).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from ..runtime._seeds import DEFAULT_SEED, derive_seed
from . import _compare as _compare_plugin
from . import _golden_options
from . import _goldens as _golden_plugin
from . import _replay as _replay_plugin

if TYPE_CHECKING:
    from ..golden._golden import Golden
    from ..runtime._determinism import SeedHandle
    from ._replay import ReplayCase

#: The fixtures that need torch: a run collecting a test that requests one reports the devices.
_TORCH_FIXTURES = frozenset({"seeded", "deterministic", "golden", _replay_plugin.FIXTURE})
#: Set when the header left the device lines to the end of collection.
_devices_pending = pytest.StashKey[bool]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("precision", "numerical precision (pytest-precision)")
    group.addoption(
        "--precision-seed",
        type=int,
        default=DEFAULT_SEED,
        metavar="N",
        help="session seed; each test's seed derives from it and the test's node id "
        f"(default {DEFAULT_SEED})",
    )
    parser.addini(
        "precision_autoseed",
        type="bool",
        default=False,
        help="seed every test as if it requested the `seeded` fixture",
    )
    _golden_options.add_options(parser)
    _compare_plugin.add_options(parser)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "precision(standard=None, rtol=None, atol=None): tolerance for this test's comparisons",
    )
    config.addinivalue_line("markers", _replay_plugin.MARKER)
    if config.getini("precision_autoseed"):
        config.pluginmanager.register(_AutoSeed(), "precision-autoseed")
    config.pluginmanager.register(_golden_plugin.GoldenPlugin(config), _golden_plugin.PLUGIN_NAME)
    if _compare_plugin.dumps_to_compare(config) is not None:
        config.pluginmanager.register(
            _compare_plugin.ComparePlugin(config), _compare_plugin.PLUGIN_NAME
        )


def pytest_report_header(config: pytest.Config) -> list[str]:
    lines = [f"precision: session seed {config.getoption('precision_seed')}"]
    if "torch" in sys.modules or _configured(config):
        lines += _device_lines()
    else:  # probing devices imports torch: wait until collection shows the run uses it
        config.stash[_devices_pending] = True
    return lines


def _configured(config: pytest.Config) -> bool:
    """Whether options or ini switch on a feature that needs torch (xdist's controller never
    collects, so this is what tells it the run uses torch)."""
    goldens = config.pluginmanager.get_plugin(_golden_plugin.PLUGIN_NAME)
    return (
        config.getoption("precision_seed") != DEFAULT_SEED
        or config.getini("precision_autoseed")
        or getattr(goldens, "golden_dir", None) is not None
        or _compare_plugin.dumps_to_compare(config) is not None
    )


def pytest_report_collectionfinish(config: pytest.Config, items: list[pytest.Item]) -> list[str]:
    if not config.stash.get(_devices_pending, False):
        return []
    in_use = "torch" in sys.modules or any(
        _TORCH_FIXTURES.intersection(getattr(item, "fixturenames", ())) for item in items
    )
    return _device_lines() if in_use else []


def _device_lines() -> list[str]:
    from ..numerics._kernels import describe
    from ..runtime._devices import backends

    lines = [f"precision metrics on cpu: {describe()}"]
    for backend in backends():
        available, reason = backend.is_available()
        if available:
            versions = ", ".join(f"{name} {value}" for name, value in backend.versions().items())
            lines.append(f"precision device {backend.name}: {backend.device_name()} ({versions})")
        else:
            lines.append(f"precision device {backend.name}: not available ({reason})")
    return lines


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if _replay_plugin.FIXTURE in metafunc.fixturenames:  # only then is a dump (and torch) loaded
        _replay_plugin.generate(metafunc)
    elif metafunc.definition.get_closest_marker("replay") is not None:
        pytest.fail(
            f"{metafunc.definition.nodeid}: @pytest.mark.replay needs the test to request the "
            f"{_replay_plugin.FIXTURE} fixture",
            pytrace=False,
        )


def _test_seed(request: pytest.FixtureRequest) -> int:
    session_seed = request.config.getoption("precision_seed")
    seed = derive_seed(session_seed, request.node.nodeid)
    request.node.add_report_section(
        "setup", "precision seed", f"{seed} (from --precision-seed {session_seed})"
    )
    return seed


@pytest.fixture
def seeded(request: pytest.FixtureRequest) -> Iterator[SeedHandle]:
    """Seed Python, numpy, torch and every device with this test's seed, dropout removed.

    The seed derives from ``--precision-seed`` and the test's node id only, so it is the same
    in any order and under xdist. Everything is restored after the test.
    """
    from ..runtime._determinism import seed_all

    with seed_all(_test_seed(request), deterministic=False) as handle:
        yield handle


@pytest.fixture
def deterministic(request: pytest.FixtureRequest) -> Iterator[SeedHandle]:
    """Like ``seeded``, plus deterministic algorithms and the determinism env vars."""
    from ..runtime._determinism import seed_all

    with seed_all(_test_seed(request), deterministic=True) as handle:
        yield handle


class _AutoSeed:
    """Registered only when the ``precision_autoseed`` ini switch is on."""

    @pytest.fixture(autouse=True)
    def _precision_autoseed(self, seeded: SeedHandle) -> SeedHandle:
        return seeded


@pytest.fixture
def golden() -> Golden:
    """This test's goldens: ``golden(value, name=None, *, standard, rtol, atol)`` compares,
    ``golden.load(name)`` reads a stored value."""
    __tracebackhide__ = True
    from ..golden._assert import current_golden

    return current_golden()


@pytest.fixture
def replay_case(request: pytest.FixtureRequest) -> ReplayCase:
    """One recorded op call on one device, from the test's ``@pytest.mark.replay``:
    ``replay_case.check()`` fails on an ``op-bug``, ``replay_case.run()`` returns the result."""
    case: ReplayCase = request.param
    return case
