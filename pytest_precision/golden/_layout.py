"""Where goldens live: the directory marker and one file path per test, written atomically.

Layout: ``<golden-dir>/pytest-precision-goldens.json`` marks the directory, and the test
``tests/test_model.py::TestX::test_y[bf16-2]`` keeps all its values in
``<golden-dir>/tests/test_model/TestX/test_y[bf16-2].safetensors``. Apart from the file
content (:mod:`._golden_files`) because it needs no torch: the pytest plugin maps every
collected test to its golden path in every run, goldens used or not.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path, PurePosixPath

from .._atomic import TEMP_SUFFIX, atomic_write

#: Bumped when the file layout changes; a file with a newer schema is refused, not misread.
SCHEMA_VERSION = 2
SUFFIX = ".safetensors"
MARKER = "pytest-precision-goldens.json"

_UNSAFE = re.compile(r"[^A-Za-z0-9_.=+,@()\[\]-]")
_MAX_PART = 100


def _safe_part(part: str, max_len: int = _MAX_PART) -> str:
    """One path component: readable, filesystem-safe, at most ``max_len`` characters, and
    distinct whenever the input differs."""
    safe = _UNSAFE.sub("_", part)
    if safe in ("", ".", ".."):
        safe = "_" * max(len(safe), 1)
    if safe != part or len(safe) > max_len:
        digest = hashlib.sha1(part.encode("utf-8")).hexdigest()[:8]
        safe = f"{safe[: max_len - 9]}-{digest}"
    return safe


def _split_nodeid(nodeid: str) -> list[str]:
    bracket = nodeid.find("[")
    head, params = (nodeid, "") if bracket < 0 else (nodeid[:bracket], nodeid[bracket:])
    file, *names = head.split("::")
    parts = file.split("/")
    parts[-1] = parts[-1].removesuffix(".py")
    parts += names
    parts[-1] += params
    return parts


def golden_relpath(nodeid: str) -> PurePosixPath:
    """Where a test's golden file lives, relative to the golden directory.

    ``tests/test_model.py::TestX::test_y[bf16-2]`` -> ``tests/test_model/TestX/test_y[bf16-2]``
    plus :data:`SUFFIX`. Characters outside ``A-Z a-z 0-9 _ . = + , @ ( ) [ ] -`` become ``_``
    and such a component gets a short hash of the original, so two ids never share a file.
    """
    *folders, name = _split_nodeid(nodeid)
    parts = [*(_safe_part(p) for p in folders), _safe_part(name, _MAX_PART - len(SUFFIX))]
    parts[-1] += SUFFIX
    return PurePosixPath(*parts)


def golden_scope(relative: PurePosixPath) -> PurePosixPath:
    """The golden folder holding the goldens of every test under a rootdir-relative path."""
    if str(relative) == ".":
        return relative
    parts = list(relative.parts)
    parts[-1] = parts[-1].removesuffix(".py")
    return PurePosixPath(*(_safe_part(p) for p in parts))


def mark_golden_dir(directory: Path) -> None:
    """Create the marker that tells a golden directory from a dump."""
    marker = directory / MARKER
    if not marker.exists():
        content = {"format": "pytest-precision goldens", "schema": SCHEMA_VERSION}
        atomic_write(marker, (json.dumps(content) + "\n").encode())


def is_golden_dir(directory: Path) -> bool:
    """A missing or empty folder, or one with the marker, holds goldens (anything else may be a
    dump). Dotfiles and READMEs (a ``.gitkeep`` keeping the folder in git) leave it empty."""
    if not directory.exists():
        return True
    if not directory.is_dir():
        return False
    return (directory / MARKER).exists() or all(_is_placeholder(p) for p in directory.iterdir())


def _is_placeholder(path: Path) -> bool:
    return path.is_file() and (path.name.startswith(".") or path.stem.upper() == "README")


def list_goldens(directory: Path) -> list[PurePosixPath]:
    """Every golden file under ``directory``, relative to it, sorted."""
    return sorted(
        PurePosixPath(p.relative_to(directory).as_posix()) for p in directory.rglob(f"*{SUFFIX}")
    )


def list_stale_temps(directory: Path) -> list[Path]:
    """Temp files left by writers that were killed before their ``os.replace``."""
    return sorted(directory.rglob(f".*{SUFFIX}.*{TEMP_SUFFIX}"))
