"""``assert_close_to_golden``: compare a test's values with stored goldens, or record them.

A :class:`Golden` belongs to one test. It reads the test's golden file (or looks names up in a
dump serving as goldens), compares each value under the resolved tolerance, and with
``update=True`` records missing or differing values instead of failing. Every comparison also
produces a JSON-ready record for reports. The pytest plugin creates one per test and makes it
the *active* golden, which :func:`assert_close_to_golden` uses. The file is
:mod:`._store`'s, the names :mod:`._names`', the failure text :mod:`._messages`', the float64
rerun's references :mod:`._shadow`'s.
"""

from __future__ import annotations

import os
import threading
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from .._errors import DumpFormatError, PrecisionError, PrecisionInputError, PrecisionWarning
from .._text import shown_text
from ..numerics._assertions import Comparison, to_tensor
from ..numerics._nested import iter_leaf_pairs
from ..numerics._standards import Standard
from ..runtime._devices import flat_fingerprint
from ._comparing import compare_leaves, validate
from ._envelope import NO_REQUEST, EnvelopeRequest, measure_envelope
from ._files import Entry, flatten
from ._masking import LeftOut, left_out_line, left_out_record, masked_call
from ._messages import mismatch_lines, record_hint, unreadable_error
from ._names import GoldenNames
from ._records import comparison_excess, device_of, golden_record
from ._shadow import RerunBook, Resolved, ShadowRun, make_pending, wants_reference
from ._sources import (
    DumpGoldens,
    GoldenDirectory,
    GoldenSource,
    environment_diff,
    environment_record,
    open_golden_source,
    recorded_device,
)
from ._store import MISSING, GoldenStore
from ._tolerances import NO_TOLERANCE, Tolerance
from ._update import Found, update_action


class Golden:
    """The goldens of one test: call it to compare a value, ``.load(name)`` to read one.

    ``Golden(golden_dir, test_id)`` works without pytest (the plugin builds one per test):
    ``golden_dir`` is a golden directory or a dump, ``test_id`` names the golden file (a pytest
    node id), ``seed`` the seed the test set (recorded in the golden's environment). With
    ``update=True`` missing or differing values are recorded instead of failing; outside the
    plugin they are written at once, inside it when the test finishes. ``float64_rerun`` says
    the caller reruns the test under :func:`float64_mode` (:meth:`begin_float64_rerun`), so
    values asked for no envelope get the rerun's float64 reference.
    """

    def __init__(
        self,
        golden_dir: str | os.PathLike[str] | GoldenSource,
        test_id: str,
        *,
        update: bool = False,
        tolerance: Tolerance = NO_TOLERANCE,
        dtype_tolerances: Mapping[torch.dtype, Tolerance] | None = None,
        record_hint: str | None = None,
        on_record: Callable[[dict[str, Any]], None] | None = None,
        autoflush: bool = True,
        seed: int | None = None,
        float64_rerun: bool = False,
    ) -> None:
        if isinstance(golden_dir, (GoldenDirectory, DumpGoldens)):
            source: GoldenSource = golden_dir
        else:
            source = open_golden_source(golden_dir)
        if update and not source.writable:
            raise PrecisionError(
                f"--golden-update cannot write into {source.path}: it is a dump, not a "
                "golden directory"
            )
        if update and isinstance(source, GoldenDirectory):
            source.migrate(test_id)  # a golden at the older layout's path moves first
        self.test_id = test_id
        self.update = update
        self.tolerance = tolerance
        self.dtype_tolerances = dict(dtype_tolerances or {})
        self.records: list[dict[str, Any]] = []
        self._store = GoldenStore(source, test_id, seed=seed, autoflush=autoflush)
        self._names = GoldenNames(test_id)
        self._failed: list[str] = []
        self._left_out: dict[str, LeftOut | None] = {}  # masked positions each golden left out
        self._record_hint = record_hint
        self._on_record = on_record
        # values of an update waiting for the float64 rerun (None: no rerun will come)
        self._rerun = RerunBook(test_id) if float64_rerun and update else None
        # Threads started by a test assert concurrently; names, staged values and records
        # are shared state (a reentrant lock: an autoflush runs inside a call).
        self._lock = threading.RLock()

    @property
    def source(self) -> GoldenSource:
        return self._store.source

    @property
    def seed(self) -> int | None:
        return self._store.seed

    @property
    def location(self) -> Path:
        """The golden file of this test (or the dump serving as goldens)."""
        return self._store.location

    # ... reading

    def envelope(self, name: str) -> dict[str, Any] | None:
        """The stored noise envelope of golden ``name`` (None: judged by the dtype default)."""
        with self._lock:
            _, _, entry = self._store.lookup(name)
        return None if entry is None or entry.envelope is None else dict(entry.envelope)

    def load(self, name: str) -> Any:
        """The stored golden value ``name`` (tensors on the CPU)."""
        with self._lock:
            where, value, _ = self._store.lookup(name)
        if value is MISSING:
            raise PrecisionError(f"no golden named {name!r} in {where}")
        return value

    def _environment_lines(self, value: Any) -> list[str]:
        recorded = self._store.recorded_environment()
        if not recorded:
            return []
        current = environment_record(device_of(value), seed=self.seed)
        flat = flat_fingerprint(recorded)
        flat["device"] = recorded_device(flat)  # a dump's manifest lists devices, not one
        return environment_diff(flat, current)

    # ... comparing

    def __call__(
        self,
        value: Any,
        name: str | None = None,
        *,
        standard: Standard | str | None = None,
        rtol: float | None = None,
        atol: float | None = None,
        reference: Any = None,
        envelope: str | None = None,
        perturbations: Sequence[Callable[[], Any]] = (),
        mask: Any = None,
    ) -> Comparison | None:
        """Compare ``value`` with the golden ``name`` (default: the call's position in the test).

        ``reference``, ``envelope`` and ``perturbations`` say how the golden's noise envelope is
        measured when it is recorded, ``mask`` which positions are padding (see
        :func:`assert_close_to_golden`). Returns the :class:`Comparison`, or ``None`` when the
        value was recorded (update mode).
        """
        __tracebackhide__ = True
        request = EnvelopeRequest(envelope, reference, tuple(perturbations))
        value, request, left_out = masked_call(value, request, mask, name)
        with self._lock:
            return self._check(value, name, Tolerance(standard, rtol, atol), request, left_out)

    def _check(
        self,
        value: Any,
        name: str | None,
        call_tolerance: Tolerance,
        request: EnvelopeRequest = NO_REQUEST,
        left_out: LeftOut | None = None,
        *,
        alone: bool = True,
    ) -> Comparison | None:
        """Look up, compare, then either stage (update) or record and raise."""
        __tracebackhide__ = True
        if self._rerun is not None and self._rerun.run is not None:
            self._rerun.run.collect(value, name)  # the float64 rerun collects, never judges
            return None
        name = self._names.take(name)
        self._left_out[name] = left_out
        try:
            self._validate(value, name, call_tolerance)
        except PrecisionInputError as exc:
            self._record(name, str(self.location), "error", message=str(exc))
            raise
        found = self._find(name)
        comparison = self._judge(value, name, call_tolerance, request, found)
        if self.update and self._staged_instead(
            value, name, call_tolerance, request, found, comparison
        ):
            return None
        if found.problem is not None:
            raise self._problem_error(name, found)
        assert comparison is not None
        self._report(value, name, call_tolerance, found, comparison, alone=alone)
        return comparison

    def _find(self, name: str) -> Found:
        try:
            where, expected, entry = self._store.lookup(name)
        except DumpFormatError as exc:
            return Found(str(exc.path), problem="unreadable", error=exc)
        return Found(where, expected, entry, None if expected is not MISSING else "missing")

    def _judge(
        self,
        value: Any,
        name: str,
        call_tolerance: Tolerance,
        request: EnvelopeRequest,
        found: Found,
    ) -> Comparison | None:
        if found.problem is not None:
            return None
        stored = found.entry.envelope if found.entry is not None else None
        references = found.entry.references if found.entry is not None else {}
        if stored is None and request.is_set:  # an older golden: measure what can be measured now
            live = request.reference if isinstance(request.reference, torch.Tensor) else None
            stored, references = measure_envelope(
                found.expected, name, EnvelopeRequest("model" if live is None else None, live), 0
            )
        found.envelope = stored
        try:
            return self._compare(value, found.expected, name, call_tolerance, stored, references)
        except PrecisionInputError as exc:  # structure, shape or dtype: a golden difference
            found.problem, found.error = "mismatch", exc
            return None

    def _staged_instead(
        self,
        value: Any,
        name: str,
        call_tolerance: Tolerance,
        request: EnvelopeRequest,
        found: Found,
        comparison: Comparison | None,
    ) -> bool:
        """In an update: stage what the check found wanting, instead of failing."""
        directory = isinstance(self.source, GoldenDirectory)
        action = update_action(found, comparison, remeasure=request.is_set and directory)
        auto = self._awaits_rerun(value, name, call_tolerance, request)
        if action is None:
            if not (auto and found.problem is None and not found.has_envelope):
                return False
            # kept, without an envelope yet: the float64 rerun may give it one
            self._defer(found.expected, name, found.where, "pass", "", comparison)
            return True
        status, message = action
        if found.problem == "unreadable":
            self._store.mark_unreadable()
        kept = found.expected if status == "remeasured" else value
        if auto:
            self._defer(kept, name, found.where, status, message, comparison)
        else:
            self._stage(kept, name, found.where, status, message, comparison, request)
        return True

    def _problem_error(self, name: str, found: Found) -> Exception:
        """Record a check that had nothing to compare with; the error to raise."""
        if found.problem == "unreadable":
            assert isinstance(found.error, DumpFormatError)
            self._record(name, found.where, "error", message=str(found.error))
            return unreadable_error(found.error, self._hint("re-record it"))
        if found.problem == "missing":
            self._record(name, found.where, "missing", message="no golden")
            return AssertionError(
                f"no golden for {name!r} of {self.test_id}: {found.where} "
                f"{'has no such value' if Path(found.where).exists() else 'does not exist'}\n"
                + self._hint("record it")
            )
        self._record(name, found.where, "error", message=str(found.error))
        self._failed.append(name)
        error = AssertionError(
            f"{self.test_id}: value does not match golden {found.where}: {found.error}\n"
            + self._hint("if the change is intended, re-record")
        )
        error.__suppress_context__ = True
        return error

    def _report(
        self,
        value: Any,
        name: str,
        call_tolerance: Tolerance,
        found: Found,
        comparison: Comparison,
        *,
        alone: bool,
    ) -> None:
        __tracebackhide__ = True
        stored = found.envelope
        excess = comparison_excess(comparison)
        self._record(
            name, found.where, comparison.verdict, comparison=comparison, envelope=(stored, excess)
        )
        if not comparison.passed:
            earlier = [n for n in self._names.order[: self._names.order.index(name)]]
            earlier = [n for n in earlier if n not in self._failed] if alone else []
            lines = mismatch_lines(
                self.test_id,
                found.where,
                name,
                comparison,
                stored,
                excess,
                first_after=earlier if not self._failed else [],
                suggest_envelope=stored is None
                and not self._tolerances_set(call_tolerance, comparison),
                environment=self._environment_lines(value),
                left_out=left_out_line(name, self._left_out.get(name)),
            )
            self._failed.append(name)
            lines.append(self._hint("if the change is intended, re-record"))
            # keys and the recorded environment come from a golden made elsewhere
            raise AssertionError(shown_text("\n".join(lines)))
        if comparison.verdict == "warn":
            warnings.warn(PrecisionWarning(comparison.message()), stacklevel=4)

    def _validate(self, value: Any, name: str, call_tolerance: Tolerance) -> None:
        validate(
            value, name, self.test_id, lambda dtype: self._tolerance_for(call_tolerance, dtype)
        )

    def _compare(
        self,
        value: Any,
        expected: Any,
        name: str,
        call_tolerance: Tolerance,
        envelope: Mapping[str, Any] | None = None,
        references: Mapping[str, torch.Tensor] | None = None,
    ) -> Comparison:
        return compare_leaves(
            value,
            expected,
            name,
            lambda dtype: self._tolerance_for(call_tolerance, dtype),
            envelope=envelope,
            references=references or {},
            same_dtype=isinstance(self.source, GoldenDirectory),
        )

    def _tolerance_for(self, call: Tolerance, dtype: torch.dtype) -> Tolerance:
        """Per call, else per test (marker), else per dtype (ini), else the dtype's default."""
        for tolerance in (call, self.tolerance, self.dtype_tolerances.get(dtype, NO_TOLERANCE)):
            if tolerance.is_set:
                return tolerance
        return NO_TOLERANCE

    def _tolerances_set(self, call: Tolerance, comparison: Comparison) -> bool:
        dtypes = {item.comparison.dtype for item in comparison.items}
        return any(self._tolerance_for(call, d).is_set for d in dtypes)

    def _hint(self, what: str) -> str:
        return record_hint(what, self.source, self.test_id, self._record_hint)

    # ... recording

    def _stage(
        self,
        value: Any,
        name: str,
        where: str,
        status: str,
        message: str,
        comparison: Comparison | None = None,
        request: EnvelopeRequest = NO_REQUEST,
    ) -> None:
        flat = flatten(value, name)
        envelope, references = measure_envelope(value, name, request, self._names.position(name))
        entry = Entry(flat.structure, flat.tensors, envelope, references)
        self._stage_entry(entry, name, where, status, message, comparison, device_of(value))

    def _stage_entry(
        self,
        entry: Entry,
        name: str,
        where: str,
        status: str,
        message: str,
        comparison: Comparison | None,
        device: torch.device | None,
    ) -> None:
        envelope = entry.envelope
        try:
            self._store.stage(name, entry, self._names.used, device)
        except PrecisionInputError as exc:
            self._record(name, where, "error", message=str(exc))
            raise
        self._record(
            name, where, status, comparison=comparison, message=message, envelope=(envelope, None)
        )
        if self._store.autoflush:
            self.flush(complete=False)

    # ... the float64 rerun (the plugin's, at --golden-update)

    def _awaits_rerun(
        self, value: Any, name: str, call_tolerance: Tolerance, request: EnvelopeRequest
    ) -> bool:
        """A value asked for nothing (no envelope, no tolerance) in an update with a rerun."""
        if self._rerun is None or request.is_set or not isinstance(self.source, GoldenDirectory):
            return False
        dtypes = {to_tensor(leaf, name).dtype for _, leaf, _ in iter_leaf_pairs(value, value)}
        if any(self._tolerance_for(call_tolerance, d).is_set for d in dtypes):
            return False
        return wants_reference(value, name)

    def _defer(
        self,
        value: Any,
        name: str,
        where: str,
        status: str,
        message: str,
        comparison: Comparison | None,
    ) -> None:
        assert self._rerun is not None
        order = self._names.position(name)
        item = make_pending(
            value, name, where, status, message, comparison, order, device_of(value)
        )
        self._stage_resolved(self._rerun.add(item))

    @property
    def awaits_float64_rerun(self) -> bool:
        """Whether values wait for the float64 rerun (the plugin reruns the test only then)."""
        with self._lock:
            return self._rerun is not None and bool(self._rerun.waiting)

    def begin_float64_rerun(self) -> ShadowRun:
        """From now until :meth:`end_float64_rerun`, calls collect values instead of checking;
        the caller runs the test body under the returned run's ``mode``."""
        with self._lock:
            assert self._rerun is not None, "Golden(..., update=True, float64_rerun=True)"
            return self._rerun.begin()

    def end_float64_rerun(self, error: BaseException | None = None) -> None:
        """Give every waiting value its envelope: the rerun's float64 reference, or with
        ``error`` (what the rerun raised), no rerun, or a rerun that does not match the test,
        the model-level rule for low-precision values (``docs/goldens-in-ci.md``)."""
        with self._lock:
            if self._rerun is not None and self._rerun.ended is None:
                self._stage_resolved(self._rerun.end(self._names.order, error))

    def _stage_resolved(self, resolved: list[Resolved]) -> None:
        for item, envelope, references, note in resolved:
            if item.status == "pass" and envelope is None:  # kept as it was
                self._record(item.name, item.where, "pass", comparison=item.comparison)
                continue
            status = "remeasured" if item.status == "pass" else item.status
            message = "; ".join(m for m in (item.message, note) if m)
            entry = Entry(item.entry.structure, item.entry.tensors, envelope, references)
            self._stage_entry(
                entry, item.name, item.where, status, message, item.comparison, item.device
            )

    def flush(self, *, complete: bool) -> None:
        """Write staged values into the test's golden file in one atomic replace.

        ``complete`` says the test ran to its end, so stored names it did not use are stale
        and dropped.
        """
        if not isinstance(self.source, GoldenDirectory) or not self.update:
            return
        with self._lock:
            self.end_float64_rerun()
            self._store.write(self._names.used, complete=complete)

    def _record(
        self,
        name: str,
        where: str,
        status: str,
        *,
        comparison: Comparison | None = None,
        message: str = "",
        envelope: tuple[Mapping[str, Any] | None, float | None] = (None, None),
    ) -> None:
        record = golden_record(
            self.test_id,
            name,
            where,
            status,
            comparison=comparison,
            message=message,
            envelope=envelope,
        )
        record.update(left_out_record(self._left_out.get(name)))
        self.records.append(record)
        if self._on_record is not None:
            self._on_record(record)
