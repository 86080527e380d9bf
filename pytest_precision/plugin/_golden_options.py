"""What the command line and the ini file say about goldens: the options, the golden
directory, per-dtype tolerances, and the start-up checks that make a bad setting one usage
error instead of a failure per test."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from .._errors import PrecisionInputError
from ..golden._layout import MARKER, is_golden_dir, mark_golden_dir

if TYPE_CHECKING:
    import torch

    from ..golden._tolerances import Tolerance


def add_options(parser: pytest.Parser) -> None:
    group = parser.getgroup("precision")
    group.addoption(
        "--golden-dir",
        metavar="DIR",
        help="folder of goldens for assert_close_to_golden (or a dump serving as goldens); "
        "ini: golden_dir",
    )
    group.addoption(
        "--golden-update",
        action="store_true",
        help="record missing goldens and rewrite differing ones (listed in the summary)",
    )
    group.addoption(
        "--golden-prune",
        action="store_true",
        help="delete golden files no collected test uses (only in an unfiltered run)",
    )
    group.addoption(
        "--precision-report",
        metavar="PATH",
        help="write every golden comparison, with its metrics, to this JSON file",
    )
    group.addoption(
        "--precision-html",
        metavar="PATH",
        help="write the session's golden comparisons as a self-contained HTML page",
    )
    # a plain string: the "paths" type splits on spaces, and folder names may hold them
    parser.addini("golden_dir", "folder of goldens (relative to the ini file)", type="string")
    parser.addini(
        "precision_tolerances",
        "per-dtype tolerances for goldens, one 'DTYPE: standard=NAME rtol=X atol=Y' per line",
        type="linelist",
    )


def golden_dir(config: pytest.Config) -> Path | None:
    option = config.getoption("golden_dir")
    if option:
        return (config.invocation_params.dir / option).resolve()
    value = config.getini("golden_dir")
    if isinstance(value, list):  # a TOML list, as the former "paths" type took
        if len(value) > 1:
            raise pytest.UsageError(f"golden_dir names one folder, got {len(value)}")
        value = value[0] if value else ""
    if not str(value).strip():
        return None
    base = config.inipath.parent if config.inipath is not None else config.rootpath
    return (base / str(value).strip()).resolve()


def dtype_tolerances(config: pytest.Config) -> dict[torch.dtype, Tolerance]:
    """The ini ``precision_tolerances``, checked at startup; torch is imported only to read
    lines that are there."""
    lines = config.getini("precision_tolerances")
    if not lines:
        return {}
    from ..golden._tolerances import parse_tolerances

    try:
        return parse_tolerances(lines)
    except PrecisionInputError as exc:
        raise pytest.UsageError(str(exc)) from None


def check_readable(golden_dir: Path | None) -> None:
    """A ``--golden-dir`` named on the command line, to read from, must exist: one usage error
    at start-up instead of a failure per test. (A ``golden_dir`` from the ini may not exist
    yet: its tests fail and the summary says so once.)"""
    if golden_dir is not None and not golden_dir.exists():
        raise pytest.UsageError(
            f"--golden-dir {golden_dir} does not exist: record the goldens with "
            "--golden-update, or fix the path"
        )


def check_writable(golden_dir: Path, *, mark: bool) -> None:
    """``--golden-update`` needs a golden directory it can create: anything else is a usage
    error at start-up, never a failure per test. ``mark``: this process (not an xdist worker)
    writes the marker, before any worker starts, so a half-written folder never looks like a
    dump."""
    if golden_dir.exists() and not golden_dir.is_dir():
        raise pytest.UsageError(f"--golden-update: --golden-dir {golden_dir} is a file")
    if not is_golden_dir(golden_dir):
        raise pytest.UsageError(
            f"--golden-update cannot write into {golden_dir}: it is a dump (or another "
            f"folder without {MARKER}), not a golden directory"
        )
    if mark:
        try:
            mark_golden_dir(golden_dir)
        except OSError as exc:
            raise pytest.UsageError(
                f"--golden-dir {golden_dir}: cannot create the golden directory "
                f"({exc.strerror or exc})"
            ) from None
