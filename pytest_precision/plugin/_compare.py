"""The dump comparison as a pytest session: ``pytest --precision-compare GOLDEN TARGET``.

With the option the session collects one item per shard (decode step, rank, decoder layer)
and nothing else. An item measures its shard, reading only that shard's tensors, and fails
when one of its calls is guilty on its own records (``compare._own_guilt``): noise passes.
What it measured travels on its test report (xdist serializes a report's extra attributes),
so the process that reports (the pytest process itself, or xdist's controller) merges every
shard's measurements and judges the first divergence across all of them, once, at the end of
the session: the report ``pytest-precision compare`` prints; the session fails on it.
``docs/scale-out.md`` says how to spread it over machines. Torch is imported only when the
option is given.
"""

from __future__ import annotations

import contextlib
import gc
import json
import threading
from collections.abc import Generator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from .._errors import PrecisionError
from .._gc import paused_gc
from .._text import shown_text

if TYPE_CHECKING:
    from ..compare._results import DumpComparison
    from ..compare._shards import Shard, ShardedComparison

PLUGIN_NAME = "precision-compare"
#: The collector's node id: items are ``precision-compare::step0-rank3-model.layers.2``.
COLLECTOR = "precision-compare"
#: The attribute of a shard's call report that carries its measurements.
PAYLOAD = "precision_compare_payload"


def add_options(parser: pytest.Parser) -> None:
    group = parser.getgroup("precision")
    group.addoption(
        "--precision-compare",
        nargs=2,
        metavar=("GOLDEN", "TARGET"),
        help="compare two dumps as a session of one test per shard (step, rank, layer) and "
        "judge the first divergence across all shards; collects nothing else (works with -n)",
    )
    parser.addini(
        "precision_compare",
        "GOLDEN TARGET: --precision-compare as a setting; `-o precision_compare='G T'` "
        "reaches xdist's remote workers unchanged (xdist rewrites command-line paths)",
        type="args",
    )
    group.addoption(
        "--precision-compare-standard",
        choices=["allclose", "ratio", "ulp", "exact"],
        help="judge every tensor of --precision-compare by this standard (default: per dtype)",
    )
    group.addoption(
        "--precision-compare-json",
        metavar="PATH",
        help="write the whole --precision-compare comparison as JSON (as `compare --json`)",
    )
    group.addoption(
        "--precision-compare-csv",
        metavar="PATH",
        help="write one row per record of --precision-compare as CSV (as `compare --csv`)",
    )
    group.addoption(
        "--precision-compare-html",
        metavar="PATH",
        help="write --precision-compare's self-contained HTML page (as `compare --html`)",
    )


class ComparePlugin:
    """Registered only with ``--precision-compare``: collection, the shards' reports, the
    judgement at the end of the session."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.worker = hasattr(config, "workerinput")
        base = config.invocation_params.dir
        self.outputs = {
            kind: None if path is None else base / path
            for kind in ("json", "csv", "html")
            for path in (config.getoption(f"precision_compare_{kind}"),)
        }

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        if self.config.pluginmanager.has_plugin("dsession"):
            # xdist's controller reads the dumps' index and aligns them (metadata) while the
            # workers start and measure, in a thread: its event loop keeps feeding them
            thread = threading.Thread(
                target=_prepare, args=(self.config,), name="precision-compare", daemon=True
            )
            thread.start()
            self.config.stash[_PREPARING_KEY] = thread

    # --- collection (serial run or xdist worker; xdist's controller collects nothing) ----------

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection(self, session: pytest.Session) -> bool | None:
        if self.config.pluginmanager.has_plugin("dsession"):
            return None  # xdist's controller: its workers collect
        hook = self.config.hook
        session.items = []
        try:
            collector = _Shards.from_parent(session, name=COLLECTOR, nodeid=COLLECTOR)
            session.items.extend(session.genitems(collector))
            self.config.pluginmanager.check_pending()
            hook.pytest_collection_modifyitems(
                session=session, config=self.config, items=session.items
            )
        finally:
            hook.pytest_collection_finish(session=session)
        session.testscollected = len(session.items)
        return True

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        _freeze_heap()

    # --- running (serial run or xdist worker) -------------------------------------------------

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        report = yield
        if call.when == "call" and _PAYLOAD_KEY in item.stash:
            # one JSON string: xdist serializes it at once, nested lists value by value
            setattr(report, PAYLOAD, json.dumps(item.stash[_PAYLOAD_KEY]))
        return report

    # --- judging (serial run or xdist controller) -----------------------------------------------

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if self.worker:
            return  # the report travels to the controller with its payload
        payload = report.__dict__.pop(PAYLOAD, None)  # kept once: the report keeps no copy
        if payload is not None:
            self.config.stash.setdefault(_RECEIVED_KEY, {})[report.nodeid] = payload

    @pytest.hookimpl(tryfirst=True)  # xdist's controller: judge while its workers exit
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if (
            self.worker
            or self.config.option.collectonly
            or session.exitstatus not in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED)
        ):
            return  # nothing ran, or a collection error (a bad dump) said why
        if _PREPARING_KEY in self.config.stash:
            self.config.stash[_PREPARING_KEY].join()
        comparison = _comparison(self.config)
        received = self.config.stash.get(_RECEIVED_KEY, {})
        missing = [s for s in comparison.shards if _nodeid(s) not in received]
        self.config.stash[_MISSING_KEY] = missing
        if missing:
            return
        for shard in comparison.shards:
            comparison.merge(json.loads(received.pop(_nodeid(shard))))
        before = comparison.measurements.computed
        result = comparison.result()
        self.config.stash[_RESULT_KEY] = result
        self.config.stash[_JUDGE_MEASURED_KEY] = comparison.measurements.computed - before
        from ..report import render_html, write_csv, write_json
        from ..report._html import write_html

        writers = {
            "json": lambda path: write_json(result, path),
            "csv": lambda path: write_csv(result, path),
            "html": lambda path: write_html(path, render_html(result)),
        }
        for kind, path in self.outputs.items():
            if path is not None:
                writers[kind](path)
        if not result.passed and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.worker or _MISSING_KEY not in self.config.stash:
            return
        terminalreporter.write_sep("=", "dump comparison (pytest-precision)")
        missing = self.config.stash[_MISSING_KEY]
        if missing:
            shards = len(_comparison(self.config).shards)
            terminalreporter.write_line(
                f"not judged: {len(missing)} of {shards} shards were not measured (deselected, "
                f"skipped, or the session stopped early; first: {missing[0].id}); the first "
                "divergence is judged only across all shards"
            )
            return
        from ..report import render

        result = self.config.stash[_RESULT_KEY]
        for line in render(result).splitlines():
            terminalreporter.write_line(shown_text(line))
        comparison = _comparison(self.config)
        found = result.first_divergence
        if found is not None:
            shard = comparison.shard_of(found.step, found.rank, found.name)
            terminalreporter.write_line(f"first divergence in shard {_nodeid(shard)}")
        terminalreporter.write_line(
            f"judged across {len(comparison.shards)} shards measured by their tests "
            f"(measured while judging: {self.config.stash[_JUDGE_MEASURED_KEY]})"
        )

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        if self.worker:
            # An xdist worker's process ends next: what _freeze_heap took, and what measuring
            # made since, stay out of the collector's last pass at the interpreter's exit
            _freeze_heap()
            return
        # Let the comparison go by reference counts, then give the collector back what
        # _freeze_heap took (a pytester run in the same process keeps its collector).
        owned: tuple[pytest.StashKey[Any], ...] = (_COMPARISON_KEY, _RECEIVED_KEY, _RESULT_KEY)
        for key in owned:
            if key in config.stash:
                del config.stash[key]
        gc.unfreeze()


class _Shards(pytest.Collector):
    """The comparison's shards, from the dumps' index (no tensor is read)."""

    def collect(self) -> list[pytest.Item]:
        try:
            shards = _comparison(self.config).shards
        except PrecisionError as exc:
            raise self.CollectError(f"--precision-compare: {exc}") from None
        return [_ShardItem.from_parent(self, name=s.id, shard=s) for s in shards]


class _ShardItem(pytest.Item):
    """One shard: fails when a call of it is guilty on its own records; a record that fails
    the standard may carry error made elsewhere (noise, or another shard's bug)."""

    def __init__(self, *, shard: Shard, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.shard = shard

    def runtest(self) -> None:
        from ..report._dumps import shard_failure_text

        part = _comparison(self.config).measure(self.shard)
        self.stash[_PAYLOAD_KEY] = part.payload
        if part.culprits:
            where = f"step {self.shard.step}, rank {self.shard.rank}, "
            where += f"layer {self.shard.layer}" if self.shard.layer else "outside the layers"
            raise _ShardFailed(shard_failure_text(where, part.culprits, part.records))

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> Any:
        if isinstance(excinfo.value, (_ShardFailed, PrecisionError)):
            return shown_text(str(excinfo.value))
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return self.path, None, f"{COLLECTOR}::{self.name}"


class _ShardFailed(AssertionError):
    """Calls of the shard are guilty on their own records."""


def dumps_to_compare(config: pytest.Config) -> tuple[str, str] | None:
    """GOLDEN and TARGET from ``--precision-compare``, else from the ``precision_compare``
    setting; None when neither is given."""
    given = config.getoption("precision_compare") or config.getini("precision_compare")
    if not given:
        return None
    if len(given) != 2:
        raise pytest.UsageError(f"precision_compare needs GOLDEN TARGET, got {given!r}")
    return given[0], given[1]


def _comparison(config: pytest.Config) -> ShardedComparison:
    """The comparison of this process: its dumps' index is read once per process."""
    if _COMPARISON_KEY not in config.stash:
        dumps = dumps_to_compare(config)
        assert dumps is not None, "the plugin is registered only with dumps to compare"
        golden, target = dumps
        standard = config.getoption("precision_compare_standard")
        with paused_gc():  # torch's import, the index and its alignment: long-lived objects
            from ..compare._shards import ShardedComparison

            comparison = ShardedComparison(golden, target, standard=standard)
            comparison.aligned.matched  # noqa: B018 (computed and kept)
        _freeze_heap()
        config.stash[_COMPARISON_KEY] = comparison
    return config.stash[_COMPARISON_KEY]


def _prepare(config: pytest.Config) -> None:
    """Read the index and align, ahead of the judgement; a failure (a bad dump, which the
    workers report too) is raised again when the judgement needs the comparison."""
    with contextlib.suppress(Exception):
        _comparison(config)


def _freeze_heap() -> None:
    """Move every object made so far out of the garbage collector's reach: the dumps' index
    (every record of both dumps) lives to the end of the session, and each full collection
    would walk it for nothing (1,152 shards of 10,624 records: 0.4 s of a 6.4 s run loop, and
    0.5 s at exit). Cycles made later are still collected; ``pytest_unconfigure`` undoes it,
    except in an xdist worker, whose process ends right after."""
    gc.freeze()


def _nodeid(shard: Shard) -> str:
    return f"{COLLECTOR}::{shard.id}"


_COMPARISON_KEY = pytest.StashKey["ShardedComparison"]()
_PAYLOAD_KEY = pytest.StashKey[dict[str, Any]]()
#: each shard's measurements (JSON), by node id
_RECEIVED_KEY = pytest.StashKey[dict[str, str]]()
#: xdist's controller: the thread reading the index while the workers measure
_PREPARING_KEY = pytest.StashKey[threading.Thread]()
_MISSING_KEY = pytest.StashKey[list["Shard"]]()
_RESULT_KEY: pytest.StashKey[DumpComparison] = pytest.StashKey()
#: what the judge measured itself (checks no shard made ahead: rare; tensors it read)
_JUDGE_MEASURED_KEY = pytest.StashKey[int]()
