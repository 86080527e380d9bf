"""The stage layers are checked, not hoped for: ``lint-imports`` keeps them, and fails on a
back-edge planted in a copy of the package (so the contract in pyproject.toml cannot go slack)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")

pytestmark = pytest.mark.skipif(
    not LINT_IMPORTS.exists(), reason="import-linter is not installed (the test extra)"
)


def _lint_imports(tree: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--config", str(tree / "pyproject.toml"), "--no-cache"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )


def _copy_package(tmp_path: Path) -> Path:
    shutil.copytree(
        ROOT / "pytest_precision",
        tmp_path / "pytest_precision",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def _plant(tree: Path, module: str, line: str) -> None:
    path = tree / "pytest_precision" / module
    path.write_text(path.read_text() + f"\n{line}\n")


def test_the_package_keeps_its_layers(tmp_path: Path) -> None:
    done = _lint_imports(_copy_package(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 kept, 0 broken" in done.stdout


def test_a_back_edge_breaks_the_layers(tmp_path: Path) -> None:
    tree = _copy_package(tmp_path)
    _plant(tree, "numerics/_stats.py", "from ..compare import _results  # noqa")
    done = _lint_imports(tree)
    assert done.returncode != 0
    assert "pytest_precision.numerics._stats -> pytest_precision.compare._results" in done.stdout


def test_a_cycle_inside_a_stage_breaks_the_acyclic_contract(tmp_path: Path) -> None:
    tree = _copy_package(tmp_path)
    # _chunks is below _stats inside numerics; importing back closes a cycle between siblings
    _plant(tree, "numerics/_chunks.py", "from . import _stats  # noqa")
    done = _lint_imports(tree)
    assert done.returncode != 0
    assert "No import cycles between sibling modules or packages BROKEN" in done.stdout


def test_a_new_stage_must_be_placed_in_the_layers(tmp_path: Path) -> None:
    tree = _copy_package(tmp_path)
    (tree / "pytest_precision" / "unplaced").mkdir()
    (tree / "pytest_precision" / "unplaced" / "__init__.py").write_text('"""."""\n')
    done = _lint_imports(tree)
    assert done.returncode != 0
    assert "unplaced" in done.stdout
