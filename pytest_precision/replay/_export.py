"""One recorded op as a self-contained pytest file, to mail to the team that owns the kernel.

The file replays the op with the ``replay`` marker from a mini dump next to it that holds only
that call's records (and the golden call's, in a second folder), so neither the whole dump nor
the model is needed to reproduce the verdict.
"""

from __future__ import annotations

import ast
import hashlib
import os
import re
from pathlib import Path

from .._atomic import atomic_write
from .._errors import PrecisionError
from .._version import __version__
from ..dump._extract import write_calls
from ..dump._load import as_dump
from ..dump._records import Dump
from ..rerun._ops import resolve_op
from ..rerun._recompute import find_call

_TEMPLATE = '''"""Replay of {name} from {source}.

Exported by pytest-precision {version}: the folder {dump_folder} next to this file holds only
this call's recorded inputs and outputs. Run `pytest {file}` with pytest-precision installed;
the test fails when the op, rerun alone, lands outside its dtype's rounding envelope.
"""

import pytest

#: The recorded call, exactly as the dump names it.
CALL = {call_literal}


@pytest.mark.replay({dump_literal}, ops={glob_literal}{golden_option})
def test_{test_name}(replay_case):
    assert replay_case.name == CALL
    replay_case.check()
'''

#: Longest slug of a call name in a file or function name; longer ones end in a hash.
_SLUG_LIMIT = 64


def name_slug(name: str) -> str:
    """``name`` as a lowercase ASCII identifier fragment for file and test names. A long name,
    or one with characters capture never writes, is cut and ends with a hash of the whole name,
    so such names stay distinct and no file name outgrows what file systems allow (255
    bytes)."""
    slug = re.sub(r"[^0-9a-z]+", "_", name.lower()).strip("_")
    if len(slug) <= _SLUG_LIMIT and re.fullmatch(r"[A-Za-z0-9_.]*", name):
        return slug  # a name as capture writes them reads as itself
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    return f"{slug[: _SLUG_LIMIT - len(digest) - 1].rstrip('_')}_{digest}"


def _literal(value: str) -> str:
    """``value`` as a Python literal that reads back as exactly ``value`` (data, never code)."""
    text = repr(value)
    if ast.literal_eval(text) != value:  # repr of a str always reads back; a guard, not a hope
        raise PrecisionError(f"cannot write {value!r} as a Python literal")
    return text


def _docstring_text(value: str, limit: int = 120) -> str:
    """``value`` for a docstring: printable ASCII without quotes or backslashes (nothing that
    could end the docstring or start an escape), cut to ``limit`` characters."""
    text = re.sub(r"[^ -~]|[\\\"\']", "?", value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def export_test(
    dump: Dump | str | os.PathLike[str],
    name: str,
    file: str | os.PathLike[str],
    *,
    golden: Dump | str | os.PathLike[str] | None = None,
    step: int | None = None,
    rank: int | None = None,
    force: bool = False,
) -> list[Path]:
    """Write the test ``file`` and its mini dump(s) next to it; the paths written. Refuses to
    overwrite anything unless ``force``."""
    target = as_dump(dump)
    call = find_call(target, name, step=step, rank=rank)
    resolve_op(call)  # a module call or an unreplayable op is refused before anything is written
    golden_call = None
    if golden is not None:
        golden_dump = as_dump(golden)
        golden_call = find_call(golden_dump, name, step=call.step, rank=call.rank)
    test_file = Path(file)
    if test_file.suffix != ".py":
        raise PrecisionError(f"{test_file}: the test file must end with .py")
    if not test_file.parent.is_dir():
        raise PrecisionError(
            f"{test_file}: the folder {test_file.parent} does not exist; create it first"
        )
    missing = [r.slot for r in call.records if r.is_tensor and r.loader is None]
    if missing:
        raise PrecisionError(
            f"{target.path}: {call.name} has no tensor data for {', '.join(missing[:3])} (a "
            "statistics-only dump); export-test needs a dump of tensors (capture mode='tensor')"
        )
    stem = test_file.stem
    folders = {"dump": test_file.with_name(f"{stem}_dump")}
    if golden_call is not None:
        folders["golden"] = test_file.with_name(f"{stem}_golden")
    sources = [target.path] + ([golden_dump.path] if golden_call is not None else [])
    for folder in folders.values():
        for source in sources:
            if _overlap(folder, source):
                raise PrecisionError(
                    f"{folder} would overwrite the dump it exports from ({source}); choose "
                    "another name for the test file"
                )
    written = [test_file, *folders.values()]
    existing = [p for p in written if p.exists()]
    if existing and not force:
        raise PrecisionError(
            f"{', '.join(map(str, existing))} already exist(s); pass --force to overwrite"
        )
    text = render_test(
        call.name,
        source=str(target.path),
        file=test_file.name,
        dump_folder=folders["dump"].name,
        golden_folder=folders["golden"].name if "golden" in folders else None,
    )
    try:
        info = {
            "level": "op",
            "mode": "tensor",
            "exported_from": str(Path(target.path).resolve()),
            "recorded_environment": target.environment,
            "call": call.name,
        }
        write_calls([call], folders["dump"], info=info, replace=force)
        if golden_call is not None:
            info = {
                **info,
                "exported_from": str(Path(golden_dump.path).resolve()),
                "recorded_environment": golden_dump.environment,
            }
            write_calls([golden_call], folders["golden"], info=info, replace=force)
        atomic_write(test_file, text.encode())
    except OSError as exc:  # a file name too long for the file system, a read-only folder
        raise PrecisionError(f"{exc.filename or test_file}: cannot write: {exc.strerror}") from None
    return written


def render_test(
    name: str, *, source: str, file: str, dump_folder: str, golden_folder: str | None
) -> str:
    """The test file replaying the call ``name``: valid Python whatever the names hold (they
    come from the dump), with every name written as a literal that reads back exactly and only
    a sanitized form of them in the docstring."""
    golden_option = "" if golden_folder is None else f", golden={_literal(golden_folder)}"
    text = _TEMPLATE.format(
        name=_docstring_text(name),
        source=_docstring_text(source),
        version=__version__,
        dump_folder=_docstring_text(dump_folder),
        file=_docstring_text(file),
        call_literal=_literal(name),
        dump_literal=_literal(dump_folder),
        glob_literal=_literal(re.sub(r"([*?\[])", r"[\1]", name)),
        golden_option=golden_option,
        test_name=name_slug(name),
    )
    compile(text, "<exported test>", "exec")  # a guard: a SyntaxError here is a bug here
    return text


def _overlap(a: Path, b: Path) -> bool:
    """One path is the other or inside it."""
    a, b = Path(a).resolve(), Path(b).resolve()
    return a == b or a in b.parents or b in a.parents
