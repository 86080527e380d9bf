"""Mutation fuzzing of dump readers: a real dump, one random mutation, then load everything.

A reader passes a mutated dump when it either loads it (and every record's ``load()`` either
returns a tensor or raises :class:`DumpFormatError`) or refuses it with one
:class:`DumpFormatError` whose message is one line naming a file. Any other exception (a bare
``RecursionError``, ``KeyError``, ``struct.error``...) fails, as does a tensor read from outside
the dump (a planted file whose every element is ``SECRET``) or a file created while loading.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pytest_precision import DumpFormatError, load_dump

#: Iterations per reader in the test suite; ``PYTEST_PRECISION_FUZZ=1000`` for a long run.
ITERATIONS = int(os.environ.get("PYTEST_PRECISION_FUZZ", "60"))
#: Added to every reader's seed: another value explores other mutations.
SEED = int(os.environ.get("PYTEST_PRECISION_FUZZ_SEED", "0"))
SECRET = 4242.5
DEEP = "[" * 100_000 + "]" * 100_000


def _junk_values(outside: Path) -> list[Any]:
    secret = str(outside / "secret.npy")
    return [
        None,
        -1,
        0,
        2**70,
        1e308,
        "nan",
        True,
        "",
        "x" * 5000,
        [],
        {},
        "../../../outside/secret.npy",
        secret,
        "..",
        ["a", 1, None],
        json.loads("[" * 300 + "]" * 300),
        {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2**40]},
        {"dtype": "torch.float32", "shape": [4], "data_name": "../../../outside/secret.npy"},
        {"dtype": "float32", "shape": [-3, 2]},
    ]


_JUNK_LINES = [
    "",
    "$Version=9.9",
    "$Object.Count=-1",
    "$Object.Length=99999999999",
    "dtype=12345",
    "dtype=abc",
    "dims=1,2,-3",
    "dims=" + ",".join(["2"] * 200),
    "format=2",
    "data=../../../../outside/secret.bin",
    "$Object.data=0,99999999",
    "$End=0",
    "\x00\xff\xfe",
    "a,b,c",
    "1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16",
    DEEP,
]


@dataclass
class FuzzOutcome:
    loaded: int = 0
    refused: int = 0
    mutations: dict[str, int] = field(default_factory=dict)


MUTATIONS = ("truncate", "flip", "delete", "structure", "deep", "line", "symlink", "junk")


def _one_line(exc: DumpFormatError) -> None:
    if "\n" in str(exc) or not exc.path:
        raise AssertionError(f"not one line naming a file: {exc!r}")


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink())


def _mutate_json(value: Any, rng: random.Random, junk: list[Any]) -> Any:
    """``value`` with one randomly chosen node (or key) replaced by junk."""
    nodes: list[tuple[Any, Any]] = []
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            nodes.extend((node, k) for k in node)
            stack.extend(node.values())
        elif isinstance(node, list):
            nodes.extend((node, i) for i in range(len(node)))
            stack.extend(node)
    if not nodes:
        return rng.choice(junk)
    container, key = rng.choice(nodes)
    if isinstance(container, dict) and rng.random() < 0.2:
        container[rng.choice(["../x", "", "Module", "Functional.x"])] = container.pop(key)
    elif rng.random() < 0.15:
        del container[key]
    else:
        container[key] = rng.choice(junk)
    return value


def mutate(root: Path, rng: random.Random, outside: Path) -> str:
    """Apply one random mutation to a file (or the tree) under ``root``; returns its kind."""
    files = _files(root)
    file = rng.choice(files)
    data = file.read_bytes()
    kind = rng.choice(
        ["truncate", "flip", "delete", "structure", "deep", "line", "symlink", "junk"]
    )
    if kind == "truncate":
        file.write_bytes(data[: rng.randrange(len(data) + 1)])
    elif kind == "flip":
        buf = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            if buf:
                buf[rng.randrange(len(buf))] = rng.randrange(256)
        file.write_bytes(bytes(buf))
    elif kind == "delete":
        file.unlink()
    elif kind == "deep":
        file.write_text('{"data": ' + DEEP + "}" if file.suffix == ".json" else DEEP)
    elif kind == "symlink":
        file.unlink()
        target = outside / ("secret" + (file.suffix if file.suffix in (".npy", ".bin") else ".npy"))
        file.symlink_to(target)
    elif kind == "junk":
        file.write_bytes(data + bytes(rng.randrange(256) for _ in range(rng.randint(1, 64))))
    elif kind == "structure" and file.suffix == ".json":
        try:
            content = json.loads(data)
        except ValueError:
            content = {}
        file.write_text(json.dumps(_mutate_json(content, rng, _junk_values(outside))))
    else:  # a line of a text file (or the text header of a binary one) replaced or removed
        lines = data.split(b"\n")
        i = rng.randrange(len(lines))
        if rng.random() < 0.3:
            del lines[i]
        else:
            lines[i] = rng.choice(_JUNK_LINES).encode("utf-8", "surrogateescape")
        file.write_bytes(b"\n".join(lines))
        kind = "line"
    return kind


def plant_secrets(outside: Path) -> None:
    """Files outside the dump that a reader must never read: every element is SECRET."""
    outside.mkdir(parents=True, exist_ok=True)
    np.save(outside / "secret.npy", np.full(4, SECRET, dtype=np.float32))
    header = "$Version=1.0\n$Object.Count=1\n$Object.Length=1\nformat=2\ndtype=0\ndims=4\n"
    payload = np.full(4, SECRET, dtype=np.float32).tobytes()
    header += f"$Object.data=0,{len(payload)}\n$End=1\n"
    (outside / "secret.bin").write_bytes(header.encode() + payload)


def check_load(root: Path) -> bool:
    """Load ``root`` and every tensor; True when loaded, False when refused properly."""
    try:
        dump = load_dump(root)
    except DumpFormatError as exc:
        _one_line(exc)
        return False
    for record in dump.records:
        try:
            tensor = record.load()
        except DumpFormatError as exc:
            _one_line(exc)
            continue
        if isinstance(tensor, torch.Tensor) and tensor.numel() and tensor.is_floating_point():
            leaked = bool((tensor.double() == SECRET).all())
            assert not leaked, f"{record.key} read data from outside the dump"
    return True


def fuzz_reader(
    source: Path,
    work: Path,
    iterations: int = ITERATIONS,
    seed: int = 0,
    entry: Callable[[Path], Path] = lambda root: root,
) -> FuzzOutcome:
    """Mutate a copy of ``source`` ``iterations`` times (one mutation each) and load it."""
    rng = random.Random(seed + SEED)
    outside = work / "outside"
    plant_secrets(outside)
    before = sorted(p.name for p in outside.iterdir())
    outcome = FuzzOutcome()
    for i in range(iterations):
        root = work / f"case{i}" / source.name
        shutil.copytree(source, root, symlinks=True)
        kind = mutate(root, rng, outside)
        outcome.mutations[kind] = outcome.mutations.get(kind, 0) + 1
        try:
            loaded = check_load(entry(root))
        except AssertionError:
            raise
        except Exception as exc:  # any other escape is the failure this fuzzing looks for
            raise AssertionError(f"case {i} ({kind}): {type(exc).__name__}: {exc}") from exc
        outcome.loaded += loaded
        outcome.refused += not loaded
        shutil.rmtree(work / f"case{i}")
    assert sorted(p.name for p in outside.iterdir()) == before
    return outcome
