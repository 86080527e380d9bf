"""The streaming writer of one rank of a native dump.

Capture hands over records in execution order; a background thread computes statistics of the
tensor copies, packs them into safetensors shards of bounded size and appends the record index.
The producer blocks while the bytes held in memory exceed a budget, so memory stays bounded
however much a forward produces. Tensors on an accelerator are reduced there and copied to the
host asynchronously (``numerics._device_stats``): the producer hands over statistics and copies
still on their way, and only this thread waits for them, so a capture does not synchronise the
device per record. ``close()`` writes ``rank.json`` (and, on rank 0, the manifest
with ``complete: true``) last and atomically: a dump cut short never looks complete.
"""

from __future__ import annotations

import functools
import os
import queue
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import torch
from safetensors.torch import load, save

from .._atomic import atomic_write
from .._errors import PrecisionError
from .._version import __version__
from ..numerics._content import copy_with_content, tensor_stats_and_content
from ..numerics._device_stats import DeviceCopy, DeviceStats
from ..numerics._stats import TensorStats, tensor_stats
from ..runtime._devices import environment_fingerprint
from ._native import json_members, json_text, numerics_settings, stats_json, write_json_atomic
from ._native_index import FORMAT_NAME, MANIFEST, RANK_DONE, RECORDS, SCHEMA_VERSION, rank_dir
from ._shard_file import CODES, write_safetensors

#: A shard is written out once its tensors reach this many bytes.
SHARD_BYTES = 32 << 20
#: Tensor bytes that may wait in memory (queued or in the open shard) before capture blocks.
PENDING_BYTES = 96 << 20


@functools.cache
def _safetensors_can_store(dtype: torch.dtype) -> bool:
    """Whether safetensors round-trips ``dtype`` exactly (not complex128, not packed float4)
    and the shard writer knows its code."""
    if dtype not in CODES:
        return False
    probe = torch.arange(16, dtype=torch.uint8).view(dtype)  # 16 bytes: at least one element
    try:
        back = load(save({"probe": probe}))["probe"]
    except Exception:  # safetensors raises assorted error types for dtypes it lacks
        return False
    return (
        back.dtype == dtype
        and back.shape == probe.shape
        and torch.equal(back.view(torch.uint8), probe.view(torch.uint8))
    )


@functools.cache
def _summarizable(dtype: torch.dtype) -> bool:
    """Whether torch can compute statistics of ``dtype`` (not of packed float4 or bits types)."""
    try:
        tensor_stats(torch.zeros(16, dtype=torch.uint8).view(dtype))
    except (RuntimeError, NotImplementedError, TypeError):
        return False
    return True


def reduced_on_device(t: torch.Tensor) -> bool:
    """Whether ``t``'s statistics and copies are made on its device, asynchronously."""
    return not t.is_cpu


def summarize(
    t: torch.Tensor, content: bool = True
) -> tuple[TensorStats | DeviceStats | None, int | None]:
    """Statistics of ``t`` (still on their way from an accelerator: :class:`DeviceStats`), or
    ``None`` for the few dtypes torch cannot reduce; and, with ``content``, from the same read
    of a host tensor, its content sum (``numerics._content``; ``None`` on an accelerator,
    where reading it would synchronise the device)."""
    if not _summarizable(t.dtype):
        return None, None
    if reduced_on_device(t):
        return DeviceStats(t), None
    return tensor_stats_and_content(t, content)


def host_stats(t: torch.Tensor) -> TensorStats | None:
    """Statistics of a host tensor (a CPU one, or a copy the writer holds)."""
    return tensor_stats(t) if _summarizable(t.dtype) else None


def private_copy(
    t: torch.Tensor, content: bool = True
) -> tuple[torch.Tensor | DeviceCopy, int | None]:
    """A contiguous host copy of ``t`` that later in-place ops cannot change: made at once on
    CPU, with ``content``, with ``t``'s content sum from the same read (``numerics._content``),
    or started asynchronously from an accelerator (the writer waits for it; no content sum)."""
    if not reduced_on_device(t):
        return copy_with_content(t, content)
    return DeviceCopy(t.detach().resolve_conj().resolve_neg()), None


@dataclass
class _Item:
    members: str
    key: str | None = None
    tensor: torch.Tensor | DeviceCopy | None = None
    stats: TensorStats | DeviceStats | None = None
    alias: str | None = None
    nbytes: int = 0


_STOP = object()


@dataclass
class _Forget:
    key: str


#: Record lines are handed to the index file in batches of this many: one write per line costs
#: as much as building the line.
_LINES_PER_WRITE = 512
#: The end of a record line without statistics or data (a JSON value, a sparse tensor).
_NO_DATA = ',"stats":null,"data":null}\n'


class DumpWriter:
    """Writes the records of one rank under ``root/rank<r>/``; usable from one producer thread."""

    def __init__(
        self,
        root: Path,
        *,
        rank: int,
        world_size: int,
        info: dict[str, Any],
        shard_bytes: int = SHARD_BYTES,
        pending_bytes: int = PENDING_BYTES,
        background: bool = True,
    ) -> None:
        self.root = Path(root)
        self.rank = rank
        self.world_size = world_size
        self.info = info
        self.folder = rank_dir(self.root, rank)
        self.shard_bytes = shard_bytes
        self.pending_limit = pending_bytes
        self.steps: set[int] = set()
        self._pending = 0
        self._pending_lock = threading.Condition()
        self._queue: queue.SimpleQueue[_Item | _Forget | object] = queue.SimpleQueue()
        self._error: BaseException | None = None
        self._count = 0
        self._shard: dict[str, torch.Tensor] = {}
        self._shard_nbytes = 0
        self._shards: dict[str, int] = {}
        self._tails: dict[str, str] = {}  # by key: the record line's end, "stats" and "data"
        self._background = background
        self._thread: threading.Thread | None = None
        self._index: TextIO | None = None
        self._lines: list[str] = []  # record lines not yet handed to the index file
        #: Without the writer thread: records held back, in order, from the first one whose
        #: statistics are still on their way from a device; written a batch at a time, so the
        #: caller waits for the device once per batch, not once per record.
        self._held: list[_Item | _Forget] = []

    # -- producer side ---------------------------------------------------------------------------

    def start(self) -> None:
        self._index = self._claim()
        if self.rank == 0:
            self._write_manifest(complete=False)
        if self._background:
            self._thread = threading.Thread(
                target=self._run, name=f"pytest-precision-dump-rank{self.rank}", daemon=True
            )
            self._thread.start()

    def _claim(self) -> TextIO:
        """The rank's record index, created exclusively: that claims the rank folder, so of two
        captures started on one path at the same moment exactly one proceeds and the other
        fails here, before writing anything (checking for an empty folder alone let both pass
        and interleave their files)."""
        if self.folder.exists() and any(self.folder.iterdir()):
            raise PrecisionError(self._taken())
        self.folder.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(self.folder / RECORDS, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            raise PrecisionError(self._taken()) from None
        return os.fdopen(fd, "w", encoding="utf-8")

    def _taken(self) -> str:
        return (
            f"{self.root}: already holds a dump ({self.folder.name}/ is taken, by an earlier "
            "capture or one still running); choose another path or delete the old dump"
        )

    def add(
        self,
        entry: dict[str, Any],
        *,
        key: str | None = None,
        tensor: torch.Tensor | None = None,
        stats: TensorStats | None = None,
        alias: str | None = None,
    ) -> None:
        """Queue one record: ``tensor`` is a private CPU copy to store under ``key``, ``stats``
        its statistics if already known; ``alias`` reuses the data and statistics of an earlier
        key; a record with neither ``key`` nor ``alias`` has no statistics and no data."""
        self.add_encoded(
            json_members(entry), entry["step"], key=key, tensor=tensor, stats=stats, alias=alias
        )

    def add_encoded(
        self,
        members: str,
        step: int,
        *,
        key: str | None = None,
        tensor: torch.Tensor | DeviceCopy | None = None,
        stats: TensorStats | DeviceStats | None = None,
        alias: str | None = None,
    ) -> None:
        """:meth:`add` for a record whose fields are already JSON object members
        (``"name":"...","slot":"output.0",...``): capture encodes the fields a call's records
        share once per call."""
        self._raise_if_failed()
        self.steps.add(step)
        if self._thread is None:  # written in the caller's thread
            if not self._held and not isinstance(stats, DeviceStats):
                self._write(members, key, tensor, stats, alias)
                return
            self._held.append(_Item(members, key, tensor, stats, alias))
            if len(self._held) >= _LINES_PER_WRITE:
                self._write_held()
            return
        if tensor is None:
            nbytes = 0
        elif isinstance(tensor, DeviceCopy):
            nbytes = tensor.nbytes
        else:
            nbytes = tensor.numel() * tensor.element_size()
        if nbytes:
            with self._pending_lock:
                # A tensor larger than the whole budget still goes through, alone.
                while self._pending and self._pending + nbytes > self.pending_limit:
                    self._raise_if_failed()  # a dead writer thread would never free memory
                    self._pending_lock.wait()
                self._pending += nbytes
        self._queue.put(_Item(members, key, tensor, stats, alias, nbytes))

    def forget(self, key: str) -> None:
        """No later record will alias ``key``: drop what was kept for that (bounded memory)."""
        if self._thread is not None:
            self._queue.put(_Forget(key))  # in order: after the records that alias it
        elif self._held:
            self._held.append(_Forget(key))
        elif self._index is not None:
            self._tails.pop(key, None)

    def close(self, *, interrupted_by: str | None = None) -> None:
        """Flush everything, then finalize: ``rank.json``, and the manifest on rank 0.

        ``interrupted_by`` names an exception that ended the captured code: the dump is still
        complete (every record written is whole), and the manifest says what cut it short.
        """
        if self._index is None:
            return
        if self._thread is not None:
            self._queue.put(_STOP)
            self._thread.join()
            self._thread = None
        else:
            self._write_held()
            self._flush_shard()
        self._write_lines()
        self._index.close()
        self._index = None
        self._raise_if_failed()
        # Only the complete manifest is flushed to disk: a marker lost to a power cut (or a
        # shard, never flushed) leaves a dump the reader calls incomplete or truncated.
        write_json_atomic(
            self.folder / RANK_DONE,
            {
                "rank": self.rank,
                "records": self._count,
                "steps": sorted(self.steps),
                "shards": self._shards,
            },
            durable=False,
        )
        if interrupted_by is not None:
            self.info["interrupted_by"] = interrupted_by
        if self.rank == 0:
            self._write_manifest(complete=True)

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise PrecisionError(f"{self.folder}: writing the dump failed: {self._error}")

    def _write_manifest(self, *, complete: bool) -> None:
        write_json_atomic(
            self.root / MANIFEST,
            {
                "format": FORMAT_NAME,
                "schema_version": SCHEMA_VERSION,
                "complete": complete,
                "created_by": f"pytest-precision {__version__}",
                **self.info,
                "world_size": self.world_size,
                "ranks": list(range(self.world_size)),
                "steps": sorted(self.steps),
                "environment": environment_fingerprint(),
                "numerics": numerics_settings(),
            },
            durable=complete,
        )

    # -- writer thread ---------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while (item := self._queue.get()) is not _STOP:
                assert isinstance(item, (_Item, _Forget))
                self._take(item)
            self._flush_shard()
        except BaseException as exc:  # reported to the producer on its next call
            self._error = exc
            with self._pending_lock:
                self._pending_lock.notify_all()

    def _take(self, item: _Item | _Forget) -> None:
        if isinstance(item, _Forget):
            self._tails.pop(item.key, None)
        else:
            self._write(item.members, item.key, item.tensor, item.stats, item.alias)

    def _write_held(self) -> None:
        held, self._held = self._held, []
        pending = [
            i.stats for i in held if isinstance(i, _Item) and isinstance(i.stats, DeviceStats)
        ]
        if pending:  # one wait for the batch: the earlier ones have arrived by then
            pending[-1].wait()
        for item in held:
            self._take(item)

    def _write(
        self,
        members: str,
        key: str | None,
        tensor: torch.Tensor | DeviceCopy | None,
        stats: TensorStats | DeviceStats | None,
        alias: str | None,
    ) -> None:
        if isinstance(tensor, DeviceCopy):
            tensor = tensor.wait()
        if isinstance(stats, DeviceStats):
            stats = stats.result()
        if alias is not None:
            tail = self._tails[alias]
        elif key is not None:
            data = None
            if tensor is not None:
                stats = stats or host_stats(tensor)
                data = self._store(key, tensor)
            encoded = "null" if stats is None else stats_json(stats)
            location = "null" if data is None else json_text(data)
            tail = self._tails[key] = f',"stats":{encoded},"data":{location}}}\n'
        else:
            tail = _NO_DATA
        self._lines.append("{" + members + tail)
        self._count += 1
        if len(self._lines) >= _LINES_PER_WRITE:
            self._write_lines()

    def _write_lines(self) -> None:
        assert self._index is not None
        self._index.write("".join(self._lines))
        self._lines.clear()

    def _store(self, key: str, tensor: torch.Tensor) -> dict[str, Any]:
        """Put ``tensor`` in the open shard; where the record's ``data`` says it is."""
        data: dict[str, Any] = {"shard": f"shard-{len(self._shards):05d}.safetensors", "key": key}
        if not _safetensors_can_store(tensor.dtype):
            tensor = tensor.reshape(-1).view(torch.uint8)
            data["bytes"] = True
        self._shard[key] = tensor
        self._shard_nbytes += tensor.numel() * tensor.element_size()
        if self._shard_nbytes >= self.shard_bytes:
            self._flush_shard()
        return data

    def _flush_shard(self) -> None:
        if not self._shard:
            return
        name = f"shard-{len(self._shards):05d}.safetensors"
        path = self.folder / name
        shard = self._shard
        atomic_write(path, lambda temp: write_safetensors(temp, shard), durable=False)
        self._shards[name] = path.stat().st_size
        released = self._shard_nbytes
        self._shard = {}
        self._shard_nbytes = 0
        with self._pending_lock:
            self._pending -= released
            self._pending_lock.notify_all()
