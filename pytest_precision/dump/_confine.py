"""Keeping a dump reader inside the dump: a dump comes from another machine or person, so a
symlink in it (a file, or a folder such as ``rank0/`` or ``dump_tensor_data/``) must not make a
reader open anything outside it.

The root the user names is trusted as given (it may itself be a symlink): :func:`dump_root`
resolves it once. Every path a reader opens goes through :func:`confine` first, which resolves
every component of the path (symlinked folders included) and refuses it, in one line naming the
link, unless the result lies inside the resolved root.
"""

from __future__ import annotations

import os
from pathlib import Path

from .._errors import DumpFormatError


def dump_root(path: str | os.PathLike[str]) -> Path:
    """The dump folder ``path`` with every symlink resolved: what :func:`confine` measures by."""
    return Path(os.path.realpath(path))


def inside(root: Path, path: Path) -> bool:
    """Whether ``path``, its symlinks resolved, lies inside ``root`` (a :func:`dump_root`)."""
    real = os.path.realpath(path)
    top = os.fspath(root)
    return real == top or real.startswith(top.rstrip(os.sep) + os.sep)


def confine(root: Path, path: Path) -> None:
    """Refuse ``path`` unless it resolves inside ``root`` (a :func:`dump_root`): a
    DumpFormatError naming ``path`` and where it leads."""
    if not inside(root, path):
        problem = (
            f"symlink points outside the dump folder {root} (to {os.path.realpath(path)}): refused"
        )
        raise DumpFormatError(path, problem)
