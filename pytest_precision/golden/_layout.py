"""Where goldens live: the directory marker and one file path per test, written atomically.

Layout: ``<golden-dir>/pytest-precision-goldens.json`` marks the directory, and the test
``tests/test_model.py::TestX::test_y[bf16-2]`` keeps all its values in
``<golden-dir>/tests/test_model.py/TestX/test_y[bf16-2].safetensors``. The test file keeps its
``.py``: a class or function name has no dot, so the folder where the file part ends is never
ambiguous and distinct node ids get distinct files (``tests/test_m.py::TestA::test_b`` and
``tests/test_m/TestA.py::test_b`` once shared ``tests/test_m/TestA/test_b``: that older layout is
still read, see :func:`legacy_golden_relpath`). Apart from the file content (:mod:`._files`)
because it needs no torch: the pytest plugin maps every collected test to its golden path in
every run, goldens used or not, and proves a file is a golden before pruning it.
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
#: The safetensors ``__metadata__`` key holding a golden's JSON metadata (its schema first).
METADATA_KEY = "pytest_precision.golden"
#: safetensors refuses headers above 100 MB; a larger length prefix is not a golden's.
_MAX_HEADER = 100_000_000

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


def _split_nodeid(nodeid: str, *, legacy: bool) -> list[str]:
    bracket = nodeid.find("[")
    head, params = (nodeid, "") if bracket < 0 else (nodeid[:bracket], nodeid[bracket:])
    file, *names = head.split("::")
    parts = file.split("/")
    if legacy:
        parts[-1] = parts[-1].removesuffix(".py")
    parts += names
    parts[-1] += params
    return parts


def _relpath(parts: list[str]) -> PurePosixPath:
    *folders, name = parts
    safe = [*(_safe_part(p) for p in folders), _safe_part(name, _MAX_PART - len(SUFFIX))]
    safe[-1] += SUFFIX
    return PurePosixPath(*safe)


def golden_relpath(nodeid: str) -> PurePosixPath:
    """Where a test's golden file lives, relative to the golden directory.

    ``tests/test_model.py::TestX::test_y[bf16-2]`` ->
    ``tests/test_model.py/TestX/test_y[bf16-2]`` plus :data:`SUFFIX`. Characters outside
    ``A-Z a-z 0-9 _ . = + , @ ( ) [ ] -`` become ``_`` and such a component (or one over 100
    characters) gets a short hash of the original, so each component maps one to one.
    """
    return _relpath(_split_nodeid(nodeid, legacy=False))


def legacy_golden_relpath(nodeid: str) -> PurePosixPath:
    """Where schema-2 goldens written before the collision-free layout live: the test file
    without its ``.py`` (``tests/test_model/TestX/test_y[bf16-2].safetensors``). Read when the
    current path is missing; ``--golden-update`` moves the file to :func:`golden_relpath`."""
    return _relpath(_split_nodeid(nodeid, legacy=True))


def golden_scope(relative: PurePosixPath, *, legacy: bool = False) -> PurePosixPath:
    """The golden folder holding the goldens of every test under a rootdir-relative path."""
    if str(relative) == ".":
        return relative
    parts = list(relative.parts)
    if legacy:
        parts[-1] = parts[-1].removesuffix(".py")
    return PurePosixPath(*(_safe_part(p) for p in parts))


def golden_schema(path: Path) -> int | None:
    """The golden schema a file's safetensors header declares, or None when the file is not
    provably a pytest-precision golden (not safetensors, or no golden metadata). Reads only the
    header (at most :data:`_MAX_HEADER` bytes), never the tensors: prune asks it of every file."""
    try:
        if path.is_symlink() or not path.is_file():
            return None
        with open(path, "rb") as f:
            size = int.from_bytes(f.read(8), "little")
            if not 2 <= size <= _MAX_HEADER:
                return None
            raw = f.read(size)
        if len(raw) != size:
            return None
        schema = json.loads(json.loads(raw)["__metadata__"][METADATA_KEY])["schema"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if isinstance(schema, bool) or not isinstance(schema, int) or schema < 1:
        return None
    return schema


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
