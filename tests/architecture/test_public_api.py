"""The public surface: each package lists its names once (``_MODULES``); ``__all__``, the lazy
lookup and the ``TYPE_CHECKING`` imports type checkers read must all say the same."""

from __future__ import annotations
import __future__

import ast
import importlib
import pkgutil
import types
from pathlib import Path

import pytest

import pytest_precision

#: Every package with a name table, the top level first.
PACKAGES = [
    pytest_precision.__name__,
    *(
        info.name
        for info in pkgutil.iter_modules(pytest_precision.__path__, "pytest_precision.")
        if info.ispkg and hasattr(importlib.import_module(info.name), "_MODULES")
    ),
]
#: Packages that document what they are for and have no public names of their own.
WITHOUT_NAMES = {"pytest_precision.rerun", "pytest_precision.plugin"}


def _type_checking_imports(package: types.ModuleType) -> dict[str, set[str]]:
    assert package.__file__ is not None
    tree = ast.parse(Path(package.__file__).read_text())
    (block,) = [
        node
        for node in tree.body
        if isinstance(node, ast.If) and ast.unparse(node.test) == "typing.TYPE_CHECKING"
    ]
    return {
        "." * node.level + (node.module or ""): {alias.name for alias in node.names}
        for node in block.body
        if isinstance(node, ast.ImportFrom)
    }


def test_every_stage_package_has_a_name_table_or_says_why_not() -> None:
    packages = {
        info.name
        for info in pkgutil.iter_modules(pytest_precision.__path__, "pytest_precision.")
        if info.ispkg
    }
    assert packages - set(PACKAGES) == WITHOUT_NAMES
    for name in packages:
        doc = importlib.import_module(name).__doc__ or ""
        assert len(doc.strip()) > 40, f"{name} says what the stage is for"


@pytest.mark.parametrize("name", PACKAGES)
def test_type_checking_imports_repeat_the_name_table(name: str) -> None:
    package = importlib.import_module(name)
    table = {module: set(names) for module, names in package._MODULES.items()}
    assert _type_checking_imports(package) == table


@pytest.mark.parametrize("name", PACKAGES)
def test_all_derives_from_the_name_table_and_every_name_resolves(name: str) -> None:
    package = importlib.import_module(name)
    tabled = {n for names in package._MODULES.values() for n in names}
    assert set(package.__all__) - tabled <= {"__version__"}
    assert tabled <= set(package.__all__)
    assert set(package.__all__) <= set(dir(package))
    for public in package.__all__:
        assert getattr(package, public) is not None, public


@pytest.mark.parametrize("name", PACKAGES[1:])
def test_the_top_level_re_exports_stage_names_as_they_are(name: str) -> None:
    package = importlib.import_module(name)
    for public in set(package.__all__) & set(pytest_precision.__all__):
        assert getattr(pytest_precision, public) is getattr(package, public), public


def test_every_assert_form_raises_an_exported_exception() -> None:
    """Output checks raise a subclass of ``OutputCheckFailed``; each such subclass is public."""
    output = importlib.import_module("pytest_precision.output")
    raised = {
        value
        for module in output._MODULES
        for value in vars(importlib.import_module(module, output.__name__)).values()
        if isinstance(value, type)
        and issubclass(value, pytest_precision.OutputCheckFailed)
        and value.__module__.startswith("pytest_precision.output")
    }
    exported = {getattr(pytest_precision, n) for n in pytest_precision.__all__}
    assert raised <= exported
    assert {
        pytest_precision.TokensDiverged,
        pytest_precision.SymptomsFound,
        pytest_precision.BadCasesFound,
        pytest_precision.WeightsNotLoaded,
        pytest_precision.GenerationDiffers,
    } <= exported


def test_no_undeclared_public_names() -> None:
    public = {
        name
        for name, value in vars(pytest_precision).items()
        if not name.startswith("_")
        and not isinstance(value, (types.ModuleType, __future__._Feature))
    }
    assert public <= set(pytest_precision.__all__)
