"""Reader for a plain folder (or a single file) of ``.npy`` / ``.npz`` / ``.pt`` / ``.safetensors``.

Such a folder has no calls, so each tensor becomes one record of kind ``File``: its ``name`` is
the file's path relative to the folder, without the suffix (``layers/0/out`` for
``layers/0/out.npy``); its ``slot`` is ``tensor`` for a file holding one tensor, or the key inside
a container file (``.npz`` array name, safetensors key, dotted path in a ``.pt`` dict / list).
Files come in natural order of their relative paths (``x2`` before ``x10``), keys within a file
in natural order too; other files are ignored, and symlinks (to tensor files or folders) leading
out of the folder refused; symlinked folders inside it are not followed.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from .._errors import DumpFormatError
from ..numerics._dtypes import dtype_name
from ._confine import confine, dump_root
from ._json_files import MAX_NESTING, TOO_DEEP
from ._records import Dump, Record
from ._safe_io import (
    load_npy,
    load_npz_array,
    load_pt,
    load_safetensors_tensor,
    npy_dtype_name,
    npy_header,
    npz_members,
    safetensors_header,
)

FORMAT = "plain"
KIND = "File"
SINGLE_SLOT = "tensor"
SUFFIXES = (".npy", ".npz", ".pt", ".safetensors")


def natural_key(text: str) -> tuple[str | int, ...]:
    """Sort key that orders embedded numbers by value: ``x2`` < ``x10``."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text))


def tensor_files(path: Path) -> list[Path]:
    """The tensor files under ``path`` (or ``path`` itself), in natural order."""
    if path.is_file():
        return [path] if path.suffix in SUFFIXES else []
    root = dump_root(path)
    files: list[Path] = []
    for entry in path.rglob("*"):  # never descends into symlinked folders
        is_tensor = entry.suffix in SUFFIXES
        if entry.is_symlink() and (is_tensor or entry.is_dir()):
            confine(root, entry)  # a linked folder would be skipped: refuse one leading out
        if is_tensor and entry.is_file():
            files.append(entry)
    return sorted(files, key=lambda f: natural_key(f.relative_to(path).as_posix()))


def read_plain_dump(path: Path) -> Dump:
    root = path.parent if path.is_file() else path
    records = [record for file in tensor_files(path) for record in _file_records(file, root)]
    return Dump(path=path, format=FORMAT, records=records)


def _file_records(file: Path, root: Path) -> Iterator[Record]:
    name = file.relative_to(root).with_suffix("").as_posix()
    op = file.suffix.removeprefix(".")
    entries: dict[str, tuple[str, tuple[int, ...], Callable[[], torch.Tensor]]] = {}
    if file.suffix == ".npy":
        shape, dtype = npy_header(file)
        entries[SINGLE_SLOT] = (
            npy_dtype_name(dtype, file),
            shape,
            functools.partial(load_npy, file),
        )
    elif file.suffix == ".npz":
        for key, (shape, dtype) in npz_members(file).items():
            loader = functools.partial(load_npz_array, file, key)
            entries[key] = (npy_dtype_name(dtype, file), shape, loader)
    elif file.suffix == ".safetensors":
        for key, (shape, dtype_str) in safetensors_header(file).items():
            entries[key] = (dtype_str, shape, functools.partial(load_safetensors_tensor, file, key))
    else:
        for key, tensor in _pt_tensors(SINGLE_SLOT, load_pt(file), file):
            loader = functools.partial(_load_pt_member, file, key)
            entries[key.removeprefix(f"{SINGLE_SLOT}.")] = (
                dtype_name(tensor.dtype),
                tuple(tensor.shape),
                loader,
            )
    for slot in sorted(entries, key=natural_key):
        dtype_text, shape, load = entries[slot]
        yield Record(
            name=name, slot=slot, kind=KIND, op=op, dtype=dtype_text, shape=shape, loader=load
        )


def _pt_tensors(prefix: str, value: Any, file: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """Tensors inside a loaded ``.pt`` object with their dotted paths; other values are skipped.

    Iterative, with the nesting bounded: a hostile file cannot exhaust the stack."""
    stack: list[tuple[str, Any, int]] = [(prefix, value, 0)]
    while stack:
        prefix, value, depth = stack.pop()
        if depth > MAX_NESTING:
            raise DumpFormatError(file, TOO_DEEP)
        if isinstance(value, torch.Tensor):
            yield prefix, value
            continue
        if isinstance(value, Mapping):
            items = [(f"{prefix}.{key}", item) for key, item in value.items()]
        elif isinstance(value, (list, tuple)):
            items = [(f"{prefix}.{i}", item) for i, item in enumerate(value)]
        else:
            continue
        stack.extend((p, v, depth + 1) for p, v in reversed(items))


def _load_pt_member(file: Path, key: str) -> torch.Tensor:
    return dict(_pt_tensors(SINGLE_SLOT, load_pt(file), file))[key]
