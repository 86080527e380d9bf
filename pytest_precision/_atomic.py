"""The one way this package writes a file: atomically and durably.

Everything written for a user (goldens, dump shards and manifests, extracts, reports, exported
tests) goes through :func:`atomic_write`: a temp file in the same folder, flushed and fsynced
(a dump's shards and markers excepted, all but its complete manifest: see ``durable``),
given the mode a plain ``open`` would give (the umask decides, not ``mkstemp``'s 0600), then
renamed over the target with ``os.replace``. A writer killed at any point leaves the old file or
the new one, never a torn one; an exception leaves no temp file behind. Torch-free: the pytest
plugin imports it in every run.
"""

from __future__ import annotations

import contextlib
import functools
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

#: Temp files are ``.<name>.<random><TEMP_SUFFIX>`` next to their target.
TEMP_SUFFIX = ".tmp"


def atomic_write(path: Path, data: bytes | Callable[[Path], None], *, durable: bool = True) -> None:
    """Write ``path`` atomically: ``data`` as bytes, or a callable that writes the temp path it
    is given (for writers such as ``safetensors.torch.save_file`` that want a file name).

    ``durable=False`` skips the fsync: the rename still means a killed process never leaves a
    torn file, only a power loss can. Dump shards use it: hundreds of MB flushed to disk during
    a capture halved the writer's speed (648 vs 1137 MiB/s), and the manifest written last
    (durable) is what makes a dump complete; the markers before it (the first manifest, each
    rank's ``rank.json``) use it too, since a lost one reads as an incomplete dump."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TEMP_SUFFIX, dir=path.parent)
    temp = Path(name)
    try:
        if isinstance(data, bytes):
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                if durable:
                    os.fsync(f.fileno())
        else:
            os.close(fd)
            data(temp)
            if durable:
                with open(temp, "rb") as f:
                    os.fsync(f.fileno())
        os.chmod(temp, _file_mode())
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            temp.unlink()
        raise


@functools.cache
def _file_mode() -> int:
    """0o666 less the process umask: what ``open(path, "w")`` would create."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask
