"""docs/architecture.md's module table is true: every module of every stage folder is listed
under its folder, and nothing listed is missing from the tree."""

from __future__ import annotations

import re
from pathlib import Path

import pytest_precision

ROOT = Path(pytest_precision.__file__).parent
DOC = ROOT.parent / "docs" / "architecture.md"


def _outside_parentheses(text: str) -> str:
    """``text`` without anything in (possibly nested) parentheses: the modules' descriptions."""
    kept, depth = [], 0
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth = max(depth - 1, 0)
        elif depth == 0:
            kept.append(char)
    return "".join(kept)


def _documented() -> dict[str, set[str]]:
    table: dict[str, set[str]] = {}
    for line in DOC.read_text().splitlines():
        row = re.match(r"\| `(\w+)/` \| (.*) \|$", line)
        if row:
            folder, cell = row.groups()
            table[folder] = set(re.findall(r"`(_\w+)`", _outside_parentheses(cell))) - {"__init__"}
    return table


def _tree() -> dict[str, set[str]]:
    return {
        folder.name: {
            path.stem
            for path in folder.glob("*.py")
            if path.stem.startswith("_") and path.stem != "__init__"
        }
        for folder in ROOT.iterdir()
        if (folder / "__init__.py").is_file()
    }


def test_every_stage_folder_has_a_row() -> None:
    assert set(_documented()) == set(_tree())


def test_every_module_is_listed_and_every_listed_module_exists() -> None:
    documented, tree = _documented(), _tree()
    missing = {f"{f}/{m}" for f in tree for m in tree[f] - documented.get(f, set())}
    stale = {f"{f}/{m}" for f in documented for m in documented[f] - tree.get(f, set())}
    assert (sorted(missing), sorted(stale)) == ([], [])
