"""The collector is paused while a dump's index is built and aligned (every full collection
would walk the whole heap for nothing), and left as it was found."""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from tp_dumps import write_tp_dump

from pytest_precision import load_dump
from pytest_precision._gc import paused_gc
from pytest_precision.compare._dumps import AlignedDumps
from pytest_precision.dump._call_index import call_index

#: The functions that build an index or align one: no collection may start inside them.
BUILDERS = frozenset({"read_native_dump", "_native_index", "align"})


@pytest.fixture
def collections() -> Iterator[list[set[str]]]:
    """For every collection from here on, the builders it started in (empty: outside them),
    with a threshold so low that any few hundred objects built trigger one."""
    seen: list[set[str]] = []

    def record(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            frames = [sys._getframe(1)]
            while (caller := frames[-1].f_back) is not None:
                frames.append(caller)
            seen.append({f.f_code.co_name for f in frames} & BUILDERS)

    threshold = gc.get_threshold()
    gc.set_threshold(50, 2, 2)
    gc.callbacks.append(record)
    try:
        yield seen
    finally:
        gc.callbacks.remove(record)
        gc.set_threshold(*threshold)


@pytest.fixture(scope="module")
def dump(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tp_dump(tmp_path_factory.mktemp("tp") / "dump", ranks=2, steps=2, layers=2)


def test_it_resumes_the_collector_it_paused_even_on_error() -> None:
    inside = []

    def fail() -> None:
        with paused_gc():
            inside.append(gc.isenabled())
            raise KeyboardInterrupt

    assert gc.isenabled()
    with pytest.raises(KeyboardInterrupt):
        fail()
    assert inside == [False]
    assert gc.isenabled()


def test_it_leaves_a_collector_paused_by_its_caller_paused() -> None:
    gc.disable()
    try:
        with paused_gc(), paused_gc():  # nested
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_no_collection_starts_while_a_dump_is_read_or_aligned(
    dump: Path, collections: list[set[str]]
) -> None:
    golden, target = load_dump(dump), load_dump(dump)
    index = call_index(dump)
    AlignedDumps(golden, target).segments  # noqa: B018 (the alignment, computed now)
    assert len(golden.records) > 50
    assert len(index.calls) > 20
    assert gc.isenabled()
    assert collections, "the threshold triggers collections (between the builders)"
    assert [found for found in collections if found] == []  # without the pause: dozens
