"""The replay side of the pytest plugin: the ``replay`` marker and the ``replay_case`` fixture.

A test marked ``@pytest.mark.replay(dump, ops=..., devices=None, golden=None)`` that requests
``replay_case`` becomes one test per recorded op call matching ``ops`` and per device. This
module imports no torch itself. Collection reads each dump's call index once per session,
whatever the number of markers naming it, and never a tensor: a native dump's index is its JSON
metadata, read without torch, and ``devices="cpu"`` needs no torch to know the CPU is there, so
10,000 cases collect about as fast as 10,000 plain parameters. The cases load the dump (and
torch) when they run.
"""

from __future__ import annotations

import fnmatch
import os
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from .._errors import PrecisionError, PrecisionWarning
from .._text import shown, shown_text

if TYPE_CHECKING:
    from ..dump import Dump
    from ..dump._call_index import CallIndex, IndexedCall
    from ..replay._verdict import ReplayResult

FIXTURE = "replay_case"
MARKER = (
    "replay(dump, ops='*', devices=None, golden=None): run the test once per op call of `dump` "
    "whose name matches the glob(s) `ops` and per device (default: every available one); the "
    "`replay_case` fixture reruns that op and judges it"
)


class SessionDumps:
    """The dumps a session's replay markers and cases read, each read once however many
    markers and cases name it: markers read a dump's call index, cases the dump itself (records;
    each case reads its own tensors). Keyed by resolved path; a dump replaced on disk since
    (another modification time) is read again."""

    def __init__(self) -> None:
        self._loaded: dict[tuple[str, str], tuple[int, Any]] = {}

    def get(self, path: str) -> Dump:
        from ..dump._load import load_dump

        dump: Dump = self._read("dump", path, load_dump)
        return dump

    def index(self, path: str) -> CallIndex:
        from ..dump._call_index import call_index

        index: CallIndex = self._read("index", path, call_index)
        return index

    def _read(self, what: str, path: str, reader: Callable[[str], Any]) -> Any:
        """``reader(path)``, or what it gave (or raised: a damaged dump fails each of its
        10,000 cases at once, not after reading it 10,000 times) for this version of the dump."""
        resolved = os.path.realpath(path)
        try:
            mtime = os.stat(resolved).st_mtime_ns
        except OSError:  # missing: the reader says so, naming the path the marker gave
            return reader(path)
        cached = self._loaded.get((what, resolved))
        if cached is None or cached[0] != mtime:
            try:
                cached = (mtime, reader(path))
            except PrecisionError as exc:
                cached = (mtime, exc)
            self._loaded[what, resolved] = cached
        if isinstance(cached[1], PrecisionError):
            raise cached[1].with_traceback(None)
        return cached[1]


#: The session's dumps: collection and every case share them (one per process under xdist).
_SESSION_DUMPS = pytest.StashKey[SessionDumps]()


def session_dumps(config: pytest.Config) -> SessionDumps:
    dumps = config.stash.get(_SESSION_DUMPS, None)
    if dumps is None:
        dumps = config.stash[_SESSION_DUMPS] = SessionDumps()
    return dumps


@dataclass(frozen=True)
class ReplayCase:
    """One recorded op call on one device; ``check()`` fails the test on an ``op-bug``."""

    dump: str
    name: str
    device: str
    step: int
    rank: int
    golden: str | None = None
    #: where the dumps are read from: the session's, shared by every case
    dumps: SessionDumps = field(default_factory=SessionDumps, repr=False, compare=False)

    def run(self) -> ReplayResult:
        """Replay the op (see :func:`pytest_precision.replay_op`); an op that cannot be rerun
        (random, uninitialized memory, ...) skips the test with the reason."""
        from ..replay._verdict import replay_op
        from ..rerun._ops import NotReplayable

        try:  # collection checked the index; a damaged record or shard shows only now
            dump = self.dumps.get(self.dump)
            golden = None if self.golden is None else self.dumps.get(self.golden)
        except PrecisionError as exc:
            pytest.fail(f"cannot replay {shown(self.name)}: {shown_text(str(exc))}", pytrace=False)
        try:
            return replay_op(
                dump,
                self.name,
                self.device,
                golden=golden,
                step=self.step,
                rank=self.rank,
            )
        except NotReplayable as exc:
            pytest.skip(f"not replayable: {shown_text(str(exc))}")

    def check(self) -> ReplayResult:
        """Fail with the report on ``op-bug``; on ``context`` pass with a PrecisionWarning
        carrying it (the op is fine, what ran around it was not)."""
        __tracebackhide__ = True
        from ..report import render

        result = self.run()
        if result.verdict == "op-bug":
            raise AssertionError(render(result))
        if result.verdict == "context":
            warnings.warn(PrecisionWarning(render(result)), stacklevel=2)
        return result


def generate(metafunc: pytest.Metafunc) -> None:
    """Parametrize a test requesting ``replay_case`` over its marker's calls and devices."""
    marker = metafunc.definition.get_closest_marker("replay")
    test = metafunc.definition.nodeid
    if marker is None:
        pytest.fail(
            f"{test}: the {FIXTURE} fixture needs @pytest.mark.replay(dump, ops=...) on the test",
            pytrace=False,
        )
    try:
        params, ids = _cases(
            marker, metafunc.definition.path.parent, session_dumps(metafunc.config)
        )
    except (PrecisionError, TypeError) as exc:
        problem = str(exc)
    else:
        metafunc.parametrize(FIXTURE, params, ids=ids, indirect=True)
        return
    # not in the except: the user's mistake is the whole story, without the exception it replaced
    pytest.fail(f"{test}: @pytest.mark.replay: {shown_text(problem)}", pytrace=False)


def _cases(marker: pytest.Mark, folder: Path, dumps: SessionDumps) -> tuple[list[Any], list[str]]:
    """The marker's cases and their ids, from the dump's index alone (no tensor is read)."""
    try:
        options = _options(*marker.args, **marker.kwargs)
    except TypeError as exc:  # a wrong argument: say it in the marker's own terms
        problem = str(exc).replace("_options()", "replay()")
        signature = "replay(dump, ops='*', devices=None, golden=None)"
        raise TypeError(f"{problem} (signature: {signature})") from None
    dump_path = _resolve(folder, options["dump"])
    golden = options["golden"]
    golden_path = None if golden is None else _resolve(folder, golden)
    calls = _matching(dumps.index(dump_path), _globs(options["ops"]))
    if golden_path is not None:
        dumps.index(golden_path)  # a missing golden is the marker's error, not every case's
    devices = [
        (device, None if unavailable is None else (pytest.mark.skip(reason=unavailable),))
        for device, unavailable in _devices(options["devices"])
    ]
    several = len({(c.name, c.step, c.rank) for c in calls}) > len({c.name for c in calls})
    params: list[Any] = []
    ids: list[str] = []
    for call in calls:
        stem = f"{call.name}-step{call.step}-rank{call.rank}-" if several else f"{call.name}-"
        for device, skip in devices:
            case = ReplayCase(
                dump_path, call.name, device, call.step, call.rank, golden_path, dumps
            )
            params.append(case if skip is None else pytest.param(case, marks=skip))
            ids.append(stem + device)
    return params, ids


def _options(
    dump: str | os.PathLike[str] | None = None,
    ops: str | Sequence[str] = "*",
    devices: str | Sequence[str] | None = None,
    golden: str | os.PathLike[str] | None = None,
) -> dict[str, Any]:
    if dump is None:
        raise TypeError("the dump to replay from is missing: replay(dump, ops=...)")
    return {"dump": dump, "ops": ops, "devices": devices, "golden": golden}


def _resolve(folder: Path, path: str | os.PathLike[str]) -> str:
    """A path relative to the test file's folder, as a string (cases are printable)."""
    return os.fspath(folder / Path(path))


def _globs(ops: str | Sequence[str]) -> tuple[str, ...]:
    if not isinstance(ops, (str, list, tuple)):
        raise TypeError(f"ops must be a glob or a list of globs, got {ops!r}")
    globs = (ops,) if isinstance(ops, str) else tuple(ops)
    if not globs or not all(isinstance(g, str) for g in globs):
        raise TypeError(f"ops must be a glob or a list of globs, got {ops!r}")
    return globs


def _matching(index: CallIndex, globs: tuple[str, ...]) -> list[IndexedCall]:
    ops = [c for c in index.calls if c.kind != "Module"]
    calls = [c for c in ops if any(fnmatch.fnmatchcase(c.name, g) for g in globs)]
    if not calls:
        some = ", ".join(sorted({c.name for c in ops})[:5]) or "none: it holds module calls only"
        raise PrecisionError(
            f"no op call of {index.path} matches {' or '.join(globs)} (op calls: {some})"
        )
    if not any(c.has_tensors for c in calls):
        raise PrecisionError(
            f"{index.path} holds statistics only; replay needs a dump of tensors "
            "(capture mode='tensor', msprobe task 'tensor')"
        )
    return calls


def _devices(devices: str | Sequence[str] | None) -> list[tuple[str, str | None]]:
    """Each device with why it cannot run here (None: it can). Without a list, the available
    backends; a listed unavailable device still gets its cases, which skip with the reason."""
    if devices is not None:
        if not isinstance(devices, (str, list, tuple)) or not devices:
            raise TypeError(
                f"devices must be a device name or a non-empty list of them, got {devices!r}"
            )
        listed = (devices,) if isinstance(devices, str) else tuple(devices)
        if listed == ("cpu",):  # always there; asking torch would cost collection its import
            return [("cpu", None)]
    from ..runtime._devices import available_devices, backend_of

    if devices is None:
        return [(backend.name, None) for backend in available_devices()]
    out = []
    for device in listed:
        available, reason = backend_of(device).is_available()
        out.append((str(device), None if available else f"{device} is not available: {reason}"))
    return out
