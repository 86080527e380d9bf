"""Reading a dump's data files ahead of the comparison, so that the disk works while it computes.

A comparison reads a folder's data files in the order its records name them, and maps each
file: without help, the pages of a file that is not in the page cache are read on first
touch, in small synchronous requests, while the metrics kernel waits. :class:`Readahead`
knows that order; each time a file is read it asks the kernel (``posix_fadvise``
``WILLNEED``, which returns once the reads are queued) to read the files after it, up to a
window ahead that starts at :data:`FIRST_WINDOW_BYTES` and doubles with every read that
goes on forward into what was read ahead, up to :data:`WINDOW_BYTES` (a reader of one record reads
little ahead, a comparison streams). The pages land in the page cache, not in this process's
memory, so memory stays flat however large the dump. Where ``posix_fadvise`` does not exist
it does nothing.
"""

from __future__ import annotations

import bisect
import os
import threading
from pathlib import Path

#: How far ahead of the file being read the kernel is asked to read: enough to keep the disk
#: busy during the comparison of a few large tensors, small beside the page cache.
WINDOW_BYTES = 256 << 20
#: The window after a read out of order (the first read included).
FIRST_WINDOW_BYTES = 16 << 20


class Readahead:
    """The data files of one folder, in the order they will most likely be read."""

    def __init__(
        self, window_bytes: int = WINDOW_BYTES, first_window_bytes: int = FIRST_WINDOW_BYTES
    ) -> None:
        self.window_bytes = window_bytes
        self.first_window_bytes = first_window_bytes
        self._window = first_window_bytes
        #: the position of the last file read (-1: none yet)
        self._last = -1
        self._files: list[Path] = []
        #: bytes of the files before each position (one more entry than files)
        self._ends: list[int] = [0]
        self._position: dict[Path, int] = {}
        #: files before this position have been advised
        self._advised = 0
        self._lock = threading.Lock()

    def add(self, file: Path, nbytes: int) -> None:
        """Append ``file`` (about ``nbytes`` long) to the order; a file already in it stays
        where it first was."""
        if file not in self._position:
            self._position[file] = len(self._files)
            self._files.append(file)
            self._ends.append(self._ends[-1] + max(nbytes, 0))

    def reading(self, file: Path) -> None:
        """``file`` is being read: have the kernel read it, and the files after it within
        the window, into the page cache (each file once)."""
        position = self._position.get(file)
        if position is None or not hasattr(os, "posix_fadvise"):
            return
        with self._lock:
            if 0 <= self._last < position <= self._advised:  # on into what was read ahead
                self._window = min(2 * self._window, self.window_bytes)
            elif position != self._last:
                self._window = self.first_window_bytes
            self._last = position
            start = max(self._advised, position)
            limit = self._ends[position] + self._window
            stop = max(bisect.bisect_right(self._ends, limit) - 1, position + 1)
            stop = min(stop, len(self._files))
            self._advised = max(self._advised, stop)
        for ahead in self._files[start:stop]:
            _will_need(ahead)


def _will_need(file: Path) -> None:
    try:
        fd = os.open(file, os.O_RDONLY)
    except OSError:  # the reader reports a missing or unreadable file itself
        return
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
    except OSError:
        pass
    finally:
        os.close(fd)
