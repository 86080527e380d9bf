"""The goldens side of the pytest plugin: one :class:`Golden` per test, reports, xdist.

Each comparison travels as a JSON user property of its test (so it lands in JUnit XML and
reaches the xdist controller with the test's reports); the controller, or the only process in
a serial run, aggregates them into the terminal summary and the JSON report. Workers send the
golden files their collection uses through ``workeroutput``, so unused goldens are found the
same way with or without xdist.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

import pytest

from .._atomic import atomic_write
from .._errors import PrecisionError, PrecisionInputError
from ..golden._active import UPDATED, activate, deactivate
from ..golden._layout import (
    MARKER,
    SUFFIX,
    golden_relpath,
    golden_scope,
    is_golden_dir,
    legacy_golden_relpath,
)
from ..golden._prune import find_unused, prune
from ..report._goldens import golden_report_document, golden_summary_lines, record_order
from ._golden_options import check_readable, check_writable, dtype_tolerances, golden_dir

if TYPE_CHECKING:
    from ..golden._golden import Golden
    from ..golden._sources import GoldenSource
    from ..golden._tolerances import Tolerance

#: Name prefix of the user properties carrying golden records (one per comparison).
PROPERTY_PREFIX = "precision.golden"
_WORKER_OUTPUT_KEY = "pytest_precision_goldens"
PLUGIN_NAME = "precision-goldens"


class GoldenPlugin:
    """Per-test goldens, and the aggregation of every comparison of the run."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.invocation_dir = config.invocation_params.dir
        self.golden_dir = golden_dir(config)
        self.update: bool = config.getoption("golden_update")
        self.prune: bool = config.getoption("golden_prune")
        report = config.getoption("precision_report")
        self.report_path = None if report is None else self.invocation_dir / report
        page = config.getoption("precision_html")
        self.html_path = None if page is None else self.invocation_dir / page
        self.dtype_tolerances = dtype_tolerances(config)
        if (self.update or self.prune) and self.golden_dir is None:
            raise pytest.UsageError("--golden-update and --golden-prune need --golden-dir DIR")
        if self.update and self.golden_dir is not None:
            check_writable(self.golden_dir, mark=not hasattr(config, "workerinput"))
        elif config.getoption("golden_dir"):
            check_readable(self.golden_dir)
        self._source: GoldenSource | PrecisionError | None = None
        self.records: list[dict[str, Any]] = []
        # what the run's collection used: golden paths, and whether it was narrowed
        self.used: set[PurePosixPath] = set()
        # the older layout's paths of the same tests: read (and kept) while they exist
        self.legacy: set[PurePosixPath] = set()
        self.legacy_found: list[PurePosixPath] = []
        self.left_alone: list[PurePosixPath] = []
        self.collected = False
        self.narrowed_by: set[str] = set()
        self.unused: list[PurePosixPath] | None = None
        self.pruned: list[str] = []
        # records each test's call report carried, to tell what its teardown added
        self._records_in_call: dict[str, int] = {}

    # --- test lifecycle (serial run or xdist worker) -------------------------------------------

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> Iterator[None]:
        __tracebackhide__ = True
        built: list[Golden] = []
        lock = threading.Lock()

        def factory() -> Golden:
            __tracebackhide__ = True
            with lock:  # threads of the test share one golden, never build a second
                if not built:
                    built.append(self._golden_for(item))
                return built[0]

        item.stash[_built_key] = built
        item.stash[_token_key] = activate(factory)
        return (yield)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Iterator[None]:
        start = _random_state() if self.update else None
        try:
            result = yield
        except (KeyboardInterrupt, pytest.exit.Exception):
            self._flush(item, complete=False)  # pytest skips the teardown: keep what was staged
            raise
        except BaseException:
            self._end_rerun(item)  # a failing test is not rerun: its records join its report
            raise
        item.stash[_call_passed_key] = True
        built = item.stash.get(_built_key, [])
        if start is not None and built and built[0].awaits_float64_rerun:
            from ._float64_rerun import rerun_in_float64

            rerun_in_float64(item, built[0], start)
        return result

    def _end_rerun(self, item: pytest.Item) -> None:
        for golden in item.stash.get(_built_key, []):
            golden.end_float64_rerun()

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_teardown(self, item: pytest.Item) -> Iterator[None]:
        # Values are written after teardown, so a fixture's teardown may assert goldens too;
        # only a test that ran to the end of its teardown has stale names to drop.
        try:
            result = yield
        except BaseException:
            self._end_test(item, complete=False)
            raise
        unwritten = self._end_test(item, complete=item.stash.get(_call_passed_key, False))
        if unwritten:  # the test errors at teardown: its goldens are not on disk
            pytest.fail(f"golden update not written: {'; '.join(unwritten)}", pytrace=False)
        return result

    def _end_test(self, item: pytest.Item, *, complete: bool) -> list[str]:
        token = item.stash.get(_token_key, None)
        if token is not None:
            deactivate(token)
            del item.stash[_token_key]
        return self._flush(item, complete=complete)

    def _flush(self, item: pytest.Item, *, complete: bool) -> list[str]:
        """Write the test's goldens; a write that fails (full or read-only disk) turns the
        records it would have made true into errors, and is returned as one line each."""
        unwritten = []
        for golden in item.stash.get(_built_key, []):
            try:
                golden.flush(complete=complete)
            except OSError as exc:
                problem = f"{exc.filename or golden.location}: {exc.strerror or exc}"
                unwritten.append(problem)
                _mark_unwritten(item, golden.test_id, problem)
        return unwritten

    def _golden_for(self, item: pytest.Item) -> Golden:
        __tracebackhide__ = True
        from ..golden._assert import record_command
        from ..golden._golden import Golden
        from ..golden._sources import open_golden_source

        if self.golden_dir is None:
            raise PrecisionError(
                "no golden directory: pass --golden-dir DIR or set golden_dir in the ini file"
            )
        if self._source is None:
            try:
                self._source = open_golden_source(self.golden_dir)
            except PrecisionError as exc:
                self._source = exc
        if isinstance(self._source, PrecisionError):
            raise self._source
        test_id = item.nodeid
        target = os.path.relpath(item.path, self.invocation_dir)
        if "::" in test_id:
            target += "::" + test_id.split("::", 1)[1]

        def on_record(record: dict[str, Any]) -> None:
            item.user_properties.append(
                (f"{PROPERTY_PREFIX}[{record['name']}]", json.dumps(record, sort_keys=True))
            )

        return Golden(
            self._source,
            test_id,
            update=self.update,
            tolerance=_marker_tolerance(item),
            dtype_tolerances=self.dtype_tolerances,
            record_hint=record_command(target, self.golden_dir, self.invocation_dir),
            on_record=on_record,
            autoflush=False,
            seed=_test_seed(item),
            float64_rerun=self.update,
        )

    # --- collection: which golden files this run uses ------------------------------------------

    def pytest_deselected(self, items: list[pytest.Item]) -> None:
        if items:
            self.narrowed_by.add("deselected tests")

    @pytest.hookimpl(wrapper=True)
    def pytest_ignore_collect(self, collection_path: Path, config: pytest.Config) -> Iterator[Any]:
        ignored = yield
        if ignored and self._has_goldens_for(collection_path):
            # --ignore, --ignore-glob, collect_ignore, norecursedirs: their goldens stay.
            self.narrowed_by.add(f"the ignored path {collection_path.name}")
        return ignored

    def _has_goldens_for(self, path: Path) -> bool:
        if self.golden_dir is None:
            return False
        try:
            relative = PurePosixPath(path.relative_to(self.config.rootpath).as_posix())
        except ValueError:
            return False
        for legacy in (False, True):
            scope = self.golden_dir / golden_scope(relative, legacy=legacy)
            if scope.is_dir() or scope.with_name(scope.name + SUFFIX).is_file():
                return True
        return False

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            self.narrowed_by.add("collection errors")
        elif report.skipped:
            self.narrowed_by.add("modules skipped at collection")

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.collected = True
        self.used.update(golden_relpath(item.nodeid) for item in session.items)
        self.legacy.update(legacy_golden_relpath(item.nodeid) for item in session.items)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        worker_output = getattr(self.config, "workeroutput", None)
        if worker_output is not None:
            worker_output[_WORKER_OUTPUT_KEY] = {
                "collected": self.collected,
                "used": sorted(str(p) for p in self.used),
                "legacy": sorted(str(p) for p in self.legacy),
                "narrowed_by": sorted(self.narrowed_by),
            }
            return
        self._find_unused()
        if self.report_path is not None:
            self._write_report()
        if self.html_path is not None:
            from ..report._html import golden_rows, goldens_html

            atomic_write(self.html_path, goldens_html(golden_rows(self.sorted_records())).encode())

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        output = getattr(node, "workeroutput", {}).get(_WORKER_OUTPUT_KEY)
        if output is None:
            self.narrowed_by.add("a worker that sent no collection")
            return
        self.collected = self.collected or output["collected"]
        self.used.update(PurePosixPath(p) for p in output["used"])
        self.legacy.update(PurePosixPath(p) for p in output.get("legacy", ()))
        self.narrowed_by.update(output["narrowed_by"])

    def _scopes(self) -> list[PurePosixPath] | None:
        """Golden folders the run's arguments cover; None when an argument names tests."""
        if self.config.getoption("lf", False):
            self.narrowed_by.add("--last-failed")
        scopes = []
        for arg in self.config.args:
            if "::" in arg:
                self.narrowed_by.add(f"the argument {arg}")
                return None
            path = (self.invocation_dir / arg).resolve()
            try:
                relative = path.relative_to(self.config.rootpath)
            except ValueError:
                self.narrowed_by.add(f"the argument {arg} outside the rootdir")
                return None
            scopes.append(golden_scope(PurePosixPath(relative.as_posix())))
        return scopes

    def _find_unused(self) -> None:
        # Only a marked golden directory: a dump serving as goldens has no unused files.
        if self.golden_dir is None or not (self.golden_dir / MARKER).is_file():
            if self.golden_dir is not None and not is_golden_dir(self.golden_dir):
                self.narrowed_by.add(f"{self.golden_dir.name} is a dump; dumps are never pruned")
            return
        if not self.collected:
            return
        self.legacy_found = sorted(
            p for p in self.legacy - self.used if (self.golden_dir / p).is_file()
        )
        scopes = self._scopes()
        if scopes is None or self.narrowed_by:
            return
        found = find_unused(self.golden_dir, self.used | self.legacy, scopes)
        self.unused, self.left_alone = found.goldens, found.left_alone
        if self.prune:
            self.pruned = prune(self.golden_dir, self.unused)

    # --- reporting (serial run or xdist controller) ---------------------------------------------

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "teardown":
            self.records += _records_of(report)

    def pytest_report_teststatus(
        self, report: pytest.CollectReport | pytest.TestReport, config: pytest.Config
    ) -> tuple[str, str, tuple[str, dict[str, bool]]] | None:
        if not isinstance(report, pytest.TestReport) or report.when == "setup":
            return None
        updated = [record["status"] in UPDATED for record in _records_of(report)]
        if report.when == "call":
            self._records_in_call[report.nodeid] = len(updated)
        else:  # teardown: what a fixture's teardown recorded, unless the call said so already
            in_call = self._records_in_call.get(report.nodeid, 0)
            updated = [] if any(updated[:in_call]) else updated[in_call:]
        if report.passed and any(updated):
            return "updated", "U", ("UPDATED", {"yellow": True})
        return None

    def sorted_records(self) -> list[dict[str, Any]]:
        return sorted(self.records, key=record_order)

    def _write_report(self) -> None:
        assert self.report_path is not None
        document = golden_report_document(
            self.sorted_records(),
            golden_dir=self.golden_dir,
            update=self.update,
            unused=self.unused,
            pruned=self.pruned,
            left_alone=self.left_alone,
        )
        atomic_write(self.report_path, document.encode())

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if getattr(self.config, "workeroutput", None) is not None:
            return
        skipped_prune = self.prune and self.unused is None
        missing_dir = (
            self.golden_dir is not None
            and not self.golden_dir.exists()
            and any(r["status"] == "missing" for r in self.records)
        )
        if not (self.records or self.unused or self.left_alone or self.legacy_found) and not (
            skipped_prune or missing_dir
        ):
            return
        terminalreporter.write_sep("=", "golden comparisons (pytest-precision)")
        lines = golden_summary_lines(
            self.sorted_records(),
            golden_dir=self.golden_dir,
            unused=self.unused,
            pruned=self.pruned,
            left_alone=self.left_alone,
            legacy=self.legacy_found,
            missing_dir=missing_dir,
            prune_skipped_because=(
                (", ".join(sorted(self.narrowed_by)) or "no collection to compare with")
                if skipped_prune
                else None
            ),
            report_path=self.report_path,
        )
        for line in lines:
            terminalreporter.write_line(line)


_built_key = pytest.StashKey[list["Golden"]]()
_token_key = pytest.StashKey[int]()
_call_passed_key = pytest.StashKey[bool]()


def _random_state() -> dict[str, Any] | None:
    """The random state a test starts from, for its float64 rerun (only when torch is in use:
    a test without torch has no goldens to rerun)."""
    if "torch" not in sys.modules:
        return None
    from ._float64_rerun import random_state

    return random_state()


def _marker_tolerance(item: pytest.Item) -> Tolerance:
    from ..golden._tolerances import Tolerance

    marker = item.get_closest_marker("precision")
    if marker is None:
        return Tolerance()
    unknown = set(marker.kwargs) - {"standard", "rtol", "atol"}
    if marker.args or unknown:
        raise PrecisionInputError(
            f"{item.nodeid}: @pytest.mark.precision takes only the keywords standard=, rtol=, "
            f"atol= (got {marker.args or ''}{sorted(unknown) or ''})"
        )
    return Tolerance(**marker.kwargs)


def _test_seed(item: pytest.Item) -> int | None:
    """The seed of the ``seeded`` / ``deterministic`` fixture when the test uses one."""
    fixtures = getattr(item, "funcargs", {})
    handle = fixtures.get("seeded") or fixtures.get("deterministic")
    return getattr(handle, "seed", None)


def _records_of(report: pytest.CollectReport | pytest.TestReport) -> list[dict[str, Any]]:
    """The golden records a report carries; only test reports have user properties."""
    return [
        json.loads(value)
        for name, value in getattr(report, "user_properties", ())
        if isinstance(name, str) and name.startswith(PROPERTY_PREFIX)
    ]


def _mark_unwritten(item: pytest.Item, test_id: str, problem: str) -> None:
    """The test's records that said a value was (re)written say it was not: the teardown
    report, which the summary and the JSON report read, carries them so."""
    for i, (name, value) in enumerate(item.user_properties):
        if not isinstance(name, str) or not name.startswith(PROPERTY_PREFIX):
            continue
        record = json.loads(str(value))
        if record["test"] == test_id and record["status"] in UPDATED:
            record.update(status="error", message=f"not written ({problem})", unwritten=True)
            item.user_properties[i] = (name, json.dumps(record, sort_keys=True))
