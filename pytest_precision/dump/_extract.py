"""A small native dump cut out of a larger one: only the records of the chosen calls.

``pytest-precision export-test`` ships one op's inputs and outputs to whoever owns the kernel,
without the gigabytes of the whole dump. The folder appears complete or not at all: it is
written under a temporary name next to its destination and renamed into place.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from .._errors import PrecisionError
from ._native import encode_value
from ._records import Call
from ._writer import DumpWriter


def write_calls(
    calls: Sequence[Call], path: Path, *, info: dict[str, Any], replace: bool = False
) -> None:
    """Write ``calls`` (every record, data included) as a one-rank native dump at ``path``;
    ``info`` goes into the manifest. An existing ``path`` is refused, or with ``replace``
    swapped out only once the new folder is complete."""
    path = Path(path)
    if path.exists() and not replace:
        raise PrecisionError(f"{path}: already exists")
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        writer = DumpWriter(staging, rank=0, world_size=1, info=info, background=False)
        writer.start()
        keys: dict[str, str] = {}  # data id -> key it is stored under here
        storages: set[int] = set()
        for number, record in enumerate(r for call in calls for r in call.records):
            entry = {
                "name": record.name,
                "kind": record.kind,
                "op": record.op,
                "module": record.module,
                "parent": record.parent,
                "step": record.step,
                "slot": record.slot,
                "dtype": record.dtype,
                "shape": None if record.shape is None else list(record.shape),
                "value": None if record.is_tensor else encode_value(record.value),
            }
            if record.stride is not None:
                entry["stride"] = list(record.stride)
            if record.data_id in keys:  # the data of an earlier record: stored once, as there
                writer.add(entry, alias=keys[record.data_id])
                continue
            tensor = record.load()
            if tensor is not None:
                writer.add(entry, key=str(number), tensor=_own_memory(tensor, storages))
                if record.data_id is not None:
                    keys[record.data_id] = str(number)
            elif record.stats is not None:
                writer.add(entry, key=str(number), stats=record.stats)
            else:
                writer.add(entry)
        writer.close()
        staging.chmod(0o755)  # mkdtemp made it private; a dump folder is not
        _swap_in(staging, path)
    except BaseException:
        with contextlib.suppress(OSError):
            shutil.rmtree(staging)
        raise


def _own_memory(tensor: torch.Tensor, storages: set[int]) -> torch.Tensor:
    """``tensor`` contiguous, copied if its memory belongs to a tensor already stored: safetensors
    refuses to write tensors that share memory (two views of one buffer, a tensor read twice)."""
    tensor = tensor.contiguous()
    if tensor.untyped_storage().data_ptr() in storages:
        tensor = tensor.clone()
    storages.add(tensor.untyped_storage().data_ptr())
    return tensor


def _swap_in(staging: Path, path: Path) -> None:
    """Rename ``staging`` to ``path``; an old ``path`` is moved aside first and deleted last."""
    if not path.exists():
        os.replace(staging, path)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".old", dir=path.parent))
    os.replace(path, old / path.name)
    os.replace(staging, path)
    shutil.rmtree(old)
