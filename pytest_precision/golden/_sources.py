"""Where goldens come from: a golden directory (one file per test) or a dump used as a golden
(a GPU baseline), and the environment each golden was recorded in."""

from __future__ import annotations

import os
from collections.abc import Mapping
from glob import escape as glob_escape
from pathlib import Path
from typing import Any

import torch

from .._errors import DumpFormatError, PrecisionError, PrecisionInputError
from ..dump import Dump, Record
from ..runtime._devices import flat_fingerprint
from ..runtime._environment import ENVIRONMENT_ORDER, diff_flat
from ._files import GoldenFile, read_golden
from ._layout import MARKER, golden_relpath, is_golden_dir, legacy_golden_relpath


def environment_record(
    device: torch.device | None = None, seed: int | None = None
) -> dict[str, str]:
    """What a golden's reader needs to judge a difference: versions, devices, flags, env vars
    (the shared fingerprint), plus the value's device and the test's seed when it seeded (an
    unseeded torch seed is random, so it would differ on every run)."""
    env = flat_fingerprint()
    env["device"] = _device_name(device)
    if seed is not None:
        env["seed"] = str(seed)
    return env


def _device_name(device: torch.device | None) -> str:
    if device is None or device.type == "cpu":
        return "cpu"
    if device.type == "cuda":
        return f"cuda ({torch.cuda.get_device_name(device)})"
    return device.type


def recorded_device(flat: Mapping[str, str]) -> str:
    """The device a record ran on: its ``device`` line, or for a dump's manifest (which lists
    the machine's devices) the accelerator it had, named as :func:`environment_record` does."""
    if "device" in flat:
        return flat["device"]
    for kind in ("npu", "cuda"):
        if flat.get(f"devices.{kind}.available") == "True":
            name = flat.get(f"devices.{kind}.device_name")
            return f"{kind} ({name})" if kind == "cuda" and name else kind
    return "cpu" if "devices.cpu.available" in flat else "-"


def environment_diff(recorded: Mapping[str, str], current: Mapping[str, str]) -> list[str]:
    """The checklist lines where the golden's environment differs from this run's, the most
    likely culprit first (ordered as :func:`diff_environment` orders). Both records come from
    :func:`environment_record`, which leaves unset variables out: a key on one side only is a
    difference (an env var set now and not then)."""
    changes = diff_flat("environment", recorded, current, ENVIRONMENT_ORDER, (), whole=True)
    return [
        f"  {c.key}: {c.golden or '-'} (golden) vs {c.target or '-'} (now)  [{c.category}]"
        for c in changes.changes
    ]


class GoldenDirectory:
    """A folder of golden files, one per test."""

    writable = True

    def __init__(self, path: Path) -> None:
        self.path = path

    def file_for(self, test_id: str) -> Path:
        """The test's golden file: at its path, or at the older layout's path while only that
        one exists (until ``--golden-update`` moves it, see :meth:`migrate`)."""
        path = self.path / golden_relpath(test_id)
        legacy = self.path / legacy_golden_relpath(test_id)
        return legacy if not path.exists() and legacy.is_file() else path

    def baseline_for(self, test_id: str, name: str) -> Path:
        """The folder where ``assert_same_generation(None, ...)`` keeps the test's run ``name``:
        next to its golden file, at either layout's path as :meth:`file_for` picks."""
        path = self.path / golden_relpath(test_id)
        legacy = self.path / legacy_golden_relpath(test_id)
        if not _run_folder(path, name).exists() and _run_folder(legacy, name).exists():
            return _run_folder(legacy, name)
        return _run_folder(path, name)

    def migrate(self, test_id: str) -> None:
        """Move the test's golden file and generation baselines from the older layout's path to
        the current one (one rename each); what cannot move stays where it is read from. Two
        tests that shared an old path (the collision the new layout fixes): the first moves it."""
        path = self.path / golden_relpath(test_id)
        legacy = self.path / legacy_golden_relpath(test_id)
        if legacy == path or not legacy.parent.is_dir():
            return
        moves = [(legacy, path)] + [
            (run, _run_folder(path, run.name[len(legacy.name) + 1 : -len(".run")]))
            for run in legacy.parent.glob(f"{glob_escape(legacy.name)}.*.run")
        ]
        for source, target in moves:
            if target.exists() or not source.exists():
                continue
            try:
                target.parent.mkdir(parents=True, exist_ok=True)
                os.replace(source, target)
            except OSError:  # moved by another worker, or a read-only folder: read in place
                continue

    def read(self, test_id: str) -> GoldenFile | None:
        path = self.file_for(test_id)
        try:
            return read_golden(path) if path.exists() else None
        except FileNotFoundError:  # moved by a concurrent --golden-update between the checks
            return None


def _run_folder(golden_file: Path, name: str) -> Path:
    return golden_file.with_name(f"{golden_file.name}.{name}.run")


class DumpGoldens:
    """A dump (for example a GPU baseline run) whose records serve as goldens, read-only.

    A name is looked up as a record key (``<record name>.<slot>``), then as a record name (its
    output, a tuple when it has several), then as a module path (the outputs of the module's
    first call).
    """

    writable = False

    def __init__(self, dump: Dump) -> None:
        self.dump = dump
        self.path = Path(dump.path)
        self._by_key: dict[str, Record] = {}
        self._by_name: dict[str, list[Record]] = {}
        self._first_call: dict[str, str] = {}
        for record in dump.records:
            self._by_key.setdefault(record.key, record)
            self._by_name.setdefault(record.name, []).append(record)
            if record.module is not None and (
                record.kind.lower() == "module" or record.name.startswith("Module.")
            ):
                self._first_call.setdefault(record.module, record.name)

    def lookup(self, name: str) -> tuple[str, Any] | None:
        """``(record description, value)`` for a name, or ``None`` when nothing matches."""
        if name in self._by_key:
            return name, self._value(self._by_key[name])
        call = name if name in self._by_name else self._first_call.get(name)
        if call is None:
            return None
        outputs = [r for r in self._by_name[call] if r.slot.startswith("output")]
        if not outputs:
            raise PrecisionInputError(
                f"{self.path}: record {call} has no output slot "
                f"(slots: {', '.join(r.slot for r in self._by_name[call])}); name one as "
                f"'{call}.<slot>'"
            )
        if len(outputs) == 1:
            return outputs[0].key, self._value(outputs[0])
        return f"{call}.output", tuple(self._value(r) for r in outputs)

    def _value(self, record: Record) -> Any:
        if not record.is_tensor:
            return record.value
        tensor = record.load()
        if tensor is None:
            raise PrecisionInputError(
                f"{self.path}: record {record.key} has statistics only; goldens need a dump "
                "with tensor data"
            )
        return tensor


GoldenSource = GoldenDirectory | DumpGoldens


def open_golden_source(path: str | os.PathLike[str]) -> GoldenSource:
    """A golden directory, or a dump when ``path`` is not one (see :func:`is_golden_dir`)."""
    path = Path(path)
    if is_golden_dir(path):
        return GoldenDirectory(path)
    from ..dump import load_dump

    try:
        dump = load_dump(path)
    except DumpFormatError as exc:
        raise PrecisionError(
            f"{path} is neither a golden directory (it has files but no {MARKER}) "
            f"nor a readable dump: {exc.problem}"
        ) from None
    return DumpGoldens(dump)
