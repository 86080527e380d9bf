"""Which files of a golden directory are unused goldens, and deleting them (``--golden-prune``).

A golden directory also holds what is not a golden: weights or fixtures kept next to the goldens,
the runs ``assert_same_generation(None, ...)`` stores beside a test's golden file. Prune deletes a
file only when its header proves it is a pytest-precision golden (:func:`golden_schema`) and no
collected test maps to it; every other ``.safetensors`` file is left alone and listed. Torch-free:
the plugin runs it at the end of a session.
"""

from __future__ import annotations

from collections.abc import Iterable, Set
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from ._layout import SUFFIX, golden_schema, list_goldens, list_stale_temps

_RUN = ".run"


@dataclass(frozen=True)
class Unused:
    """The golden directory's ``.safetensors`` files no collected test uses."""

    #: Provably goldens (golden metadata in the header): ``--golden-prune`` deletes these.
    goldens: list[PurePosixPath]
    #: Not provably goldens (weights, fixtures, an orphaned generation run): never deleted.
    left_alone: list[PurePosixPath]


def is_used(path: PurePosixPath, used: Set[PurePosixPath]) -> bool:
    """``path`` is a used golden file, or lies in a run stored beside one (the folder
    ``<golden file>.<name>.run`` of ``assert_same_generation``)."""
    if path in used:
        return True
    for folder in path.parents:
        head = folder.name.removesuffix(_RUN)
        if head == folder.name:
            continue
        # the golden file's name is a prefix ending in SUFFIX, followed by ".<name>"
        end = head.find(SUFFIX + ".")
        while end >= 0:
            if folder.parent / head[: end + len(SUFFIX)] in used:
                return True
            end = head.find(SUFFIX + ".", end + 1)
    return False


def find_unused(
    directory: Path, used: Set[PurePosixPath], scopes: Iterable[PurePosixPath]
) -> Unused:
    """The files under ``scopes`` (golden folders the run covered) that no used path claims.

    A run of part of the tree (``pytest tests/sub``) leaves out files without a ``.py`` folder
    in their path: one at the older layout's path (``tests/sub/test_x.safetensors``) may belong
    to ``tests/sub.py``, which that run did not collect."""
    scopes = list(scopes)
    whole_tree = any(str(scope) == "." for scope in scopes)
    goldens: list[PurePosixPath] = []
    left_alone: list[PurePosixPath] = []
    for path in list_goldens(directory):
        if is_used(path, used) or not any(_is_under(path, scope) for scope in scopes):
            continue
        if not whole_tree and not any(p.endswith(".py") for p in path.parent.parts):
            continue
        (left_alone if golden_schema(directory / path) is None else goldens).append(path)
    return Unused(goldens, left_alone)


def prune(directory: Path, goldens: Iterable[PurePosixPath]) -> list[str]:
    """Delete the unused goldens, the temp files of killed golden writers and the folders left
    empty; returns what was deleted. Each file's header is checked again right before."""
    pruned = []
    for path in goldens:
        if golden_schema(directory / path) is not None:
            (directory / path).unlink()
            pruned.append(str(path))
    for temp in list_stale_temps(directory):
        temp.unlink()
    _remove_empty_dirs(directory)
    return pruned


def _is_under(path: PurePosixPath, scope: PurePosixPath) -> bool:
    return str(scope) == "." or scope in path.parents


def _remove_empty_dirs(root: Path) -> None:
    for folder in sorted((p for p in root.rglob("*") if p.is_dir()), reverse=True):
        if not any(folder.iterdir()):
            folder.rmdir()
