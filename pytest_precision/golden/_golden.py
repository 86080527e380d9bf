"""``assert_close_to_golden``: compare a test's values with stored goldens, or record them.

A :class:`Golden` belongs to one test. It reads the test's golden file (or looks names up in a
dump serving as goldens), compares each value under the resolved tolerance, and with
``update=True`` records missing or differing values instead of failing. Every comparison also
produces a JSON-ready record for reports. The pytest plugin creates one per test and makes it
the *active* golden, which :func:`assert_close_to_golden` uses.
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
from ..numerics._assertions import Comparison, ItemComparison, compare, to_tensor
from ..numerics._comparison import _check_pair, resolve_standard
from ..numerics._nested import iter_leaf_pairs
from ..numerics._standards import Standard
from ..runtime._devices import flat_fingerprint
from ._envelope import (
    NO_REQUEST,
    EnvelopeRequest,
    describe,
    envelope_standard,
    measure_envelope,
)
from ._files import (
    Entry,
    GoldenFile,
    NewerSchemaError,
    check_distinct_keys,
    flatten,
    read_golden,
    write_golden,
)
from ._layout import mark_golden_dir
from ._masking import LeftOut, left_out_line, left_out_record, masked_call
from ._records import badness, comparison_excess, describe_tensor, device_of, item_summary
from ._sources import (
    DumpGoldens,
    GoldenDirectory,
    GoldenSource,
    environment_diff,
    environment_record,
    open_golden_source,
    recorded_device,
)
from ._tolerances import NO_TOLERANCE, Tolerance

_AUTO_NAME = "#"


_MISSING = object()


class Golden:
    """The goldens of one test: call it to compare a value, ``.load(name)`` to read one.

    ``Golden(golden_dir, test_id)`` works without pytest (the plugin builds one per test):
    ``golden_dir`` is a golden directory or a dump, ``test_id`` names the golden file (a pytest
    node id), ``seed`` the seed the test set (recorded in the golden's environment). With
    ``update=True`` missing or differing values are recorded instead of failing; outside the
    plugin they are written at once, inside it when the test finishes.
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
    ) -> None:
        if isinstance(golden_dir, (GoldenDirectory, DumpGoldens)):
            self.source: GoldenSource = golden_dir
        else:
            self.source = open_golden_source(golden_dir)
        if update and not self.source.writable:
            raise PrecisionError(
                f"--golden-update cannot write into {self.source.path}: it is a dump, not a "
                "golden directory"
            )
        if update and isinstance(self.source, GoldenDirectory):
            self.source.migrate(test_id)  # a golden at the older layout's path moves first
        self.test_id = test_id
        self.seed = seed
        self.update = update
        self.tolerance = tolerance
        self.dtype_tolerances = dict(dtype_tolerances or {})
        self.records: list[dict[str, Any]] = []
        self._record_hint = record_hint
        self._on_record = on_record
        self._autoflush = autoflush
        self._file: GoldenFile | object | None = _MISSING
        self._used: set[str] = set()
        self._order: list[str] = []  # names in recording order
        self._failed: list[str] = []
        self._calls = 0
        self._staged: dict[str, Entry] = {}
        self._file_unreadable = False
        self._device: torch.device | None = None
        self._left_out: dict[str, LeftOut | None] = {}  # masked positions each golden left out
        # Threads started by a test assert concurrently; names, staged values and records
        # are shared state (a reentrant lock: an autoflush runs inside a call).
        self._lock = threading.RLock()

    @property
    def location(self) -> Path:
        """The golden file of this test (or the dump serving as goldens)."""
        if isinstance(self.source, GoldenDirectory):
            return self.source.file_for(self.test_id)
        return self.source.path

    # ... reading

    def _golden_file(self) -> GoldenFile | None:
        if self._file is _MISSING:
            assert isinstance(self.source, GoldenDirectory)
            self._file = self.source.read(self.test_id)
        return self._file  # type: ignore[return-value]

    def _lookup_entry(self, name: str) -> tuple[str, Any, Entry | None]:
        """``(where, expected, stored entry)``; ``expected`` is ``_MISSING`` when there is no
        golden, the entry carries the value's envelope."""
        if isinstance(self.source, DumpGoldens):
            found = self.source.lookup(name)
            if found is None:
                return f"{self.source.path} (no record or module named {name!r})", _MISSING, None
            key, value = found
            return f"{self.source.path} record {key}", value, None
        where = str(self.location)
        golden_file = self._golden_file()
        if golden_file is None or name not in golden_file.entries:
            return where, _MISSING, None
        return where, golden_file.value(name), golden_file.entries[name]

    def envelope(self, name: str) -> dict[str, Any] | None:
        """The stored noise envelope of golden ``name`` (None: judged by the dtype default)."""
        with self._lock:
            _, _, entry = self._lookup_entry(name)
        return None if entry is None or entry.envelope is None else dict(entry.envelope)

    def load(self, name: str) -> Any:
        """The stored golden value ``name`` (tensors on the CPU)."""
        with self._lock:
            where, value, _ = self._lookup_entry(name)
        if value is _MISSING:
            raise PrecisionError(f"no golden named {name!r} in {where}")
        return value

    def _environment_lines(self, value: Any) -> list[str]:
        if isinstance(self.source, DumpGoldens):
            recorded: Mapping[str, Any] = self.source.dump.environment
        else:
            golden_file = self._golden_file()
            recorded = golden_file.environment if golden_file else {}
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
        measured when it is recorded, ``mask`` (see :func:`assert_close_to_golden`). Returns the
        :class:`Comparison`, or ``None`` when the value was recorded (update mode).
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
        __tracebackhide__ = True
        name = self._name(name)
        self._left_out[name] = left_out
        try:
            self._validate(value, name, call_tolerance)
        except PrecisionInputError as exc:
            self._record(name, str(self.location), "error", message=str(exc))
            raise
        try:
            where, expected, entry = self._lookup_entry(name)
        except DumpFormatError as exc:
            if self.update and not isinstance(exc, NewerSchemaError):
                self._file, self._file_unreadable = None, True
                return self._stage(
                    value, name, exc.path, "rewritten", f"was unreadable: {exc}", request=request
                )
            self._record(name, str(exc.path), "error", message=str(exc))
            raise
        if expected is _MISSING:
            if self.update:
                return self._stage(value, name, where, "recorded", "no golden yet", request=request)
            self._record(name, where, "missing", message="no golden")
            raise AssertionError(
                f"no golden for {name!r} of {self.test_id}: {where} "
                f"{'has no such value' if Path(where).exists() else 'does not exist'}\n"
                + self._hint("record it")
            )
        stored = entry.envelope if entry is not None else None
        references = entry.references if entry is not None else {}
        if stored is None and request.is_set:  # an older golden: measure what can be measured now
            live = request.reference if isinstance(request.reference, torch.Tensor) else None
            stored, references = measure_envelope(
                expected, name, EnvelopeRequest("model" if live is None else None, live), 0
            )
        try:
            comparison = self._compare(value, expected, name, call_tolerance, stored, references)
        except PrecisionInputError as exc:
            if self.update:
                return self._stage(value, name, where, "rewritten", str(exc), request=request)
            self._record(name, where, "error", message=str(exc))
            self._failed.append(name)
            raise AssertionError(
                f"{self.test_id}: value does not match golden {where}: {exc}\n"
                + self._hint("if the change is intended, re-record")
            ) from None
        if self.update and not comparison.passed:
            return self._stage(
                value, name, where, "rewritten", "differed", comparison, request=request
            )
        if self.update and request.is_set and isinstance(self.source, GoldenDirectory):
            # the value is kept; its envelope is measured anew (a new reference, new reruns)
            return self._stage(
                expected, name, where, "remeasured", "envelope re-measured", comparison, request
            )
        excess = comparison_excess(comparison)
        self._record(
            name, where, comparison.verdict, comparison=comparison, envelope=(stored, excess)
        )
        if not comparison.passed:
            lines = [f"{self.test_id}: golden mismatch (golden: {where})"]
            if excess is not None:
                lines.append(
                    f"{name}: {excess:.3g}x the limit of {describe(stored)} "
                    f"({100 * (excess - 1):.3g} % beyond it)"
                )
            lines.append(comparison.message() + left_out_line(name, left_out))
            earlier = [n for n in self._order[: self._order.index(name)] if n not in self._failed]
            if alone and earlier and not self._failed:
                lines.append(
                    f"first failing golden of this test: {name} ({', '.join(earlier)} passed)"
                )
            self._failed.append(name)
            if stored is None and not self._tolerances_set(call_tolerance, comparison):
                lines.append(
                    "if this value came out of many ops, record a float64 reference with it "
                    "(reference=...) or pass envelope='model' (docs/standards.md)"
                )
            env = self._environment_lines(value)
            if env:
                lines += ["environment differs from the run that recorded the golden:", *env]
            lines.append(self._hint("if the change is intended, re-record"))
            # keys and the recorded environment come from a golden made elsewhere
            raise AssertionError(shown_text("\n".join(lines)))
        if comparison.verdict == "warn":
            warnings.warn(PrecisionWarning(comparison.message()), stacklevel=3)
        return comparison

    def _name(self, name: str | None) -> str:
        if name is None:
            name = f"{_AUTO_NAME}{self._calls}"
            self._calls += 1
        elif not isinstance(name, str) or not name or name.startswith(_AUTO_NAME):
            raise PrecisionInputError(
                f"golden name must be a non-empty string not starting with {_AUTO_NAME!r}, "
                f"not {name!r}"
            )
        if name in self._used:
            raise PrecisionInputError(
                f"golden name {name!r} is used twice in {self.test_id}; names must be unique "
                "within a test"
            )
        self._used.add(name)
        self._order.append(name)
        return name

    def _validate(self, value: Any, name: str, call_tolerance: Tolerance) -> None:
        """An uncomparable value or an unusable tolerance is the test's error, never a golden
        difference: checked before the golden is read, so an update never rewrites for it."""
        for path, leaf, _ in iter_leaf_pairs(value, value):
            label = f"{name}{path}"
            tensor = to_tensor(leaf, label)
            tolerance = self._tolerance_for(call_tolerance, tensor.dtype)
            try:
                _check_pair(tensor, tensor, "value")
                resolve_standard(
                    tolerance.standard, tensor.dtype, rtol=tolerance.rtol, atol=tolerance.atol
                )
            except PrecisionInputError as exc:
                raise PrecisionInputError(f"{self.test_id}: golden {label}: {exc}") from None

    def _compare(
        self,
        value: Any,
        expected: Any,
        name: str,
        call_tolerance: Tolerance,
        envelope: Mapping[str, Any] | None = None,
        references: Mapping[str, torch.Tensor] | None = None,
    ) -> Comparison:
        """Compare leaf by leaf: the tolerance may depend on each leaf's dtype. With the value
        and tolerance validated, a :class:`PrecisionInputError` here is a golden difference
        (structure, shape, dtype)."""
        items = []
        for path, a_leaf, e_leaf in iter_leaf_pairs(value, expected):
            label = f"{name}{path}"
            a = to_tensor(a_leaf, label)
            e = to_tensor(e_leaf, f"{label} (golden)")
            if isinstance(self.source, GoldenDirectory) and (
                a.dtype != e.dtype or a.shape != e.shape
            ):
                raise PrecisionInputError(
                    f"{label}: value is {describe_tensor(a)}, golden is {describe_tensor(e)}"
                )
            tolerance = self._tolerance_for(call_tolerance, a.dtype)
            chosen, reference = None, None
            if not tolerance.is_set:  # no override: the stored envelope, if any
                chosen, reference = envelope_standard(envelope, references or {}, label, e)
            result = compare(
                a,
                e.to(a.device),
                standard=chosen or tolerance.standard,
                rtol=tolerance.rtol,
                atol=tolerance.atol,
                reference=None if reference is None else reference.to(a.device),
                name=label,
            )
            items += [ItemComparison(path, i.comparison, i.details) for i in result.items]
        return Comparison(name, tuple(items))

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
        if not self.source.writable:  # a dump: --golden-update would be refused
            return (
                f"the golden is a dump ({self.source.path}), which is read-only: if the change "
                "is intended, capture the baseline dump again on the reference machine, or "
                "record a golden directory with --golden-dir DIR --golden-update"
                if "re-record" in what
                else f"{what} in a golden directory (--golden-dir DIR --golden-update); a "
                f"dump ({self.source.path}) is read-only"
            )
        command = self._record_hint or (
            f"Golden({str(self.source.path)!r}, {self.test_id!r}, update=True)(value, name)"
        )
        return f"{what} with:\n  {command}"

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
        entry = flatten(value, name)
        envelope, references = measure_envelope(
            value, name, request, self._order.index(name) if name in self._order else 0
        )
        entry = Entry(entry.structure, entry.tensors, envelope, references)
        golden_file = None if self._file_unreadable else self._golden_file()
        # stored values this test asserted stay; the others may still be dropped as stale
        kept = {
            n: e for n, e in (golden_file.entries if golden_file else {}).items() if n in self._used
        }
        kept.update(self._staged)
        kept[name] = entry
        try:
            check_distinct_keys(kept, self.location)
        except PrecisionInputError as exc:
            self._record(name, where, "error", message=str(exc))
            raise
        self._staged[name] = entry
        self._device = self._device or device_of(value)
        self._record(
            name, where, status, comparison=comparison, message=message, envelope=(envelope, None)
        )
        if self._autoflush:
            self.flush(complete=False)

    def flush(self, *, complete: bool) -> None:
        """Write staged values into the test's golden file in one atomic replace.

        ``complete`` says the test ran to its end, so stored names it did not use are stale
        and dropped.
        """
        if not isinstance(self.source, GoldenDirectory) or not self.update:
            return
        with self._lock:
            self._write(complete=complete)

    def _write(self, *, complete: bool) -> None:
        if not self._staged and not complete:
            return
        try:
            golden_file = None if self._file_unreadable else self._golden_file()
        except DumpFormatError:
            if self._staged:
                raise
            return  # a file this version must not rewrite (newer schema): its test reported it
        entries: dict[str, Entry] = dict(golden_file.entries) if golden_file else {}
        stale = set(entries) - self._used if complete else set()
        if not self._staged and not stale:
            return
        for name in stale:
            del entries[name]
        entries.update(self._staged)
        path = self.location
        mark_golden_dir(self.source.path)
        write_golden(path, entries, environment_record(self._device, seed=self.seed))
        self._file = read_golden(path) if self._autoflush else _MISSING
        self._staged.clear()
        self._file_unreadable = False

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
        record: dict[str, Any] = {
            "test": self.test_id,
            "name": name,
            "golden": where,
            "status": status,
            "message": message,
            **left_out_record(self._left_out.get(name)),
        }
        stored, excess = envelope
        if stored is not None or excess is not None:
            record["envelope"] = {
                "kind": None if stored is None else stored.get("kind"),
                "order": None if stored is None else stored.get("order"),
                "excess": excess,
            }
        if comparison is not None and comparison.items:
            worst = max(comparison.items, key=lambda item: badness(item.comparison))
            record["verdict"] = comparison.verdict
            record["standard"] = worst.comparison.standard.name
            record["worst"] = item_summary(worst)
            record["items"] = [item_summary(item) for item in comparison.items]
        self.records.append(record)
        if self._on_record is not None:
            self._on_record(record)
