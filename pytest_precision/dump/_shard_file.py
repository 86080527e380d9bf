"""A dump shard written as a safetensors file without holding the GIL while its bytes go out.

``safetensors.torch.save_file`` holds the GIL for the whole write: a 64 MiB file stalls every
other thread for 37 ms (measured). The dump writer's thread writes shards while the model runs,
so each shard stopped the model's thread (and capture) for as long as the disk took. Here the
header is built in Python and each tensor's bytes are handed to ``FileIO.write`` straight from
its memory, which releases the GIL during the system call.

The format (safetensors' specification): the header's length as 8 little-endian bytes; the
header, a JSON object mapping each name to its ``dtype`` code, ``shape`` and ``data_offsets``
(from the end of the header), padded with spaces to a multiple of 8 bytes; then the tensors'
bytes, little-endian, in order, with no gap. ``safetensors`` reads it back, and so does every
other reader.
"""

from __future__ import annotations

import io
import json
import struct
import sys
from pathlib import Path

import numpy as np
import torch

from ._safe_io import SAFETENSORS_DTYPES

#: safetensors' dtype code by torch dtype
CODES = {getattr(torch, name): code for code, name in SAFETENSORS_DTYPES.items()}


def write_safetensors(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    """Write ``tensors`` (contiguous, on the host, of dtypes in :data:`CODES`) to ``path``."""
    header: dict[str, object] = {}
    offset = 0
    for key, t in tensors.items():
        nbytes = t.numel() * t.element_size()
        entry = {"dtype": CODES[t.dtype], "shape": list(t.shape)}
        header[key] = entry | {"data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb", buffering=0) as f:
        _write_all(f, struct.pack("<Q", len(text)) + text)
        for t in tensors.values():
            if t.numel():
                _write_all(f, _little_endian(t).data)


def _little_endian(t: torch.Tensor) -> np.ndarray:
    """``t``'s bytes in safetensors' order, little-endian: its memory itself, except on a
    big-endian machine (each component's bytes reversed, in a copy)."""
    flat = t.reshape(-1).view(torch.uint8).numpy()
    component = t.element_size() // (2 if t.is_complex() else 1)
    if sys.byteorder == "little" or component == 1:
        return flat
    return np.ascontiguousarray(flat.reshape(-1, component)[:, ::-1]).reshape(-1)


def _write_all(f: io.FileIO, data: bytes | memoryview) -> None:
    """Write every byte of ``data`` to the unbuffered file ``f`` (a write may be partial)."""
    view = memoryview(data).cast("B")
    while view:
        written = f.write(view)
        view = view[written or 0 :]
