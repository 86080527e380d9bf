"""The golden file of one test: read once, values staged, written in one atomic replace."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from .._errors import DumpFormatError
from ._files import Entry, GoldenFile, check_distinct_keys, read_golden, write_golden
from ._layout import mark_golden_dir
from ._sources import DumpGoldens, GoldenDirectory, GoldenSource, environment_record

#: ``expected`` of a name with no golden.
MISSING: Any = object()
_UNREAD = object()


class GoldenStore:
    """What a test's goldens read and write: its file in a golden directory, or a dump."""

    def __init__(
        self, source: GoldenSource, test_id: str, *, seed: int | None, autoflush: bool
    ) -> None:
        self.source = source
        self.test_id = test_id
        self.seed = seed
        self.autoflush = autoflush
        self._file: GoldenFile | object | None = _UNREAD
        self._unreadable = False
        self._staged: dict[str, Entry] = {}
        self._device: torch.device | None = None

    @property
    def location(self) -> Path:
        if isinstance(self.source, GoldenDirectory):
            return self.source.file_for(self.test_id)
        return self.source.path

    def golden_file(self) -> GoldenFile | None:
        if self._unreadable:
            return None
        if self._file is _UNREAD:
            assert isinstance(self.source, GoldenDirectory)
            self._file = self.source.read(self.test_id)
        return self._file  # type: ignore[return-value]

    def mark_unreadable(self) -> None:
        """The file is corrupt: an update rewrites it from the staged values alone."""
        self._file, self._unreadable = None, True

    def lookup(self, name: str) -> tuple[str, Any, Entry | None]:
        """``(where, expected, stored entry)``; ``expected`` is :data:`MISSING` when there is
        no golden. A corrupt file raises :class:`DumpFormatError`."""
        if isinstance(self.source, DumpGoldens):
            found = self.source.lookup(name)
            if found is None:
                return f"{self.source.path} (no record or module named {name!r})", MISSING, None
            key, value = found
            return f"{self.source.path} record {key}", value, None
        where = str(self.location)
        golden_file = self.golden_file()
        if golden_file is None or name not in golden_file.entries:
            return where, MISSING, None
        return where, golden_file.value(name), golden_file.entries[name]

    def recorded_environment(self) -> Mapping[str, Any]:
        if isinstance(self.source, DumpGoldens):
            return self.source.dump.environment
        golden_file = self.golden_file()
        return golden_file.environment if golden_file else {}

    def stage(self, name: str, entry: Entry, used: set[str], device: torch.device | None) -> None:
        """Keep ``entry`` for the next write; refuses a name whose stored keys collide with
        another value's (:class:`PrecisionInputError`)."""
        golden_file = self.golden_file()
        # stored values this test asserted stay; the others may still be dropped as stale
        kept = {n: e for n, e in (golden_file.entries if golden_file else {}).items() if n in used}
        kept.update(self._staged)
        kept[name] = entry
        check_distinct_keys(kept, self.location)
        self._staged[name] = entry
        self._device = self._device or device

    def write(self, used: set[str], *, complete: bool) -> None:
        """Write staged values in one atomic replace; with ``complete``, drop stored names the
        test no longer used."""
        if not isinstance(self.source, GoldenDirectory) or (not self._staged and not complete):
            return
        try:
            golden_file = self.golden_file()
        except DumpFormatError:
            if self._staged:
                raise
            return  # a file this version must not rewrite (newer schema): its test reported it
        entries: dict[str, Entry] = dict(golden_file.entries) if golden_file else {}
        stale = set(entries) - used if complete else set()
        if not self._staged and not stale:
            return
        for name in stale:
            del entries[name]
        entries.update(self._staged)
        path = self.location
        mark_golden_dir(self.source.path)
        write_golden(path, entries, environment_record(self._device, seed=self.seed))
        self._file = read_golden(path) if self.autoflush else _UNREAD
        self._staged.clear()
        self._unreadable = False
