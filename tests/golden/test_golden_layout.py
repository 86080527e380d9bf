"""Golden layout: one file per test id by construction, the older layout's paths, and the
header check that proves a file is a golden before prune may delete it."""

from __future__ import annotations

import json
from pathlib import Path, PurePosixPath

import safetensors.torch
import torch
from hypothesis import given
from hypothesis import strategies as st

from pytest_precision.golden._files import flatten, write_golden
from pytest_precision.golden._layout import golden_relpath, golden_schema, legacy_golden_relpath
from pytest_precision.golden._prune import find_unused, is_used

_IDENTIFIER = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,12}", fullmatch=True)
_FOLDER = st.text(st.characters(blacklist_characters="/\x00:[", codec="utf-8"), min_size=1)


@st.composite
def _node_ids(draw: st.DrawFn) -> str:
    """Python test ids as pytest spells them: folders (any name, dots included), a file
    ending in .py, classes, a function, optional parameters (any text)."""
    folders = draw(st.lists(_FOLDER.filter(lambda f: f not in (".", "..")), max_size=3))
    module = draw(_FOLDER) + ".py"
    names = draw(st.lists(_IDENTIFIER, min_size=1, max_size=3))
    params = draw(st.one_of(st.just(""), st.text(max_size=150).map(lambda p: f"[{p}]")))
    return "/".join([*folders, module]) + "::" + "::".join(names) + params


@st.composite
def _resplit_ids(draw: st.DrawFn) -> list[str]:
    """Two ids over the same words that end the file part at different words: the pairs
    that collide when the file part loses its ``.py``."""
    words = draw(st.lists(_IDENTIFIER, min_size=3, max_size=6))
    ends = draw(st.lists(st.integers(0, len(words) - 2), min_size=2, max_size=2, unique=True))
    return [
        "/".join([*words[:end], words[end] + ".py"]) + "::" + "::".join(words[end + 1 :])
        for end in ends
    ]


@given(st.one_of(st.lists(_node_ids(), min_size=2, max_size=2, unique=True), _resplit_ids()))
def test_distinct_node_ids_map_to_distinct_golden_files(ids: list[str]) -> None:
    first, second = (golden_relpath(i) for i in ids)
    assert first != second


def test_the_ids_that_shared_a_file_in_the_older_layout_no_longer_do() -> None:
    ids = ["tests/test_m.py::TestA_test::test_b", "tests/test_m/TestA_test.py::test_b"]
    assert legacy_golden_relpath(ids[0]) == legacy_golden_relpath(ids[1])
    assert [str(golden_relpath(i)) for i in ids] == [
        "tests/test_m.py/TestA_test/test_b.safetensors",
        "tests/test_m/TestA_test.py/test_b.safetensors",
    ]


def test_only_a_file_with_golden_metadata_is_provably_a_golden(tmp_path: Path) -> None:
    golden = tmp_path / "golden.safetensors"
    write_golden(golden, {"x": flatten(torch.ones(2), "x")}, {})
    weights = tmp_path / "weights.safetensors"
    safetensors.torch.save_file({"w": torch.ones(2)}, str(weights), metadata={"a": "b"})
    huge_header = tmp_path / "huge.safetensors"
    huge_header.write_bytes((2**40).to_bytes(8, "little") + b"{}")
    lying = tmp_path / "lying.safetensors"
    header = json.dumps({"__metadata__": {"pytest_precision.golden": '{"schema": true}'}})
    lying.write_bytes(len(header).to_bytes(8, "little") + header.encode())
    link = tmp_path / "link.safetensors"
    link.symlink_to(golden)
    assert golden_schema(golden) == 2
    for path in (weights, huge_header, lying, tmp_path / "absent.safetensors", link):
        assert golden_schema(path) is None, path


def test_generation_runs_beside_a_used_golden_are_used() -> None:
    used = {PurePosixPath("t.py/test_g.safetensors")}
    run = "t.py/test_g.safetensors.generation.run"
    assert is_used(PurePosixPath(f"{run}/logprobs.safetensors"), used)
    assert is_used(PurePosixPath(f"{run}/dump/step0/rank0/shard.safetensors"), used)
    assert not is_used(PurePosixPath("t.py/test_h.safetensors.generation.run/x.safetensors"), used)
    assert not is_used(PurePosixPath("t.py/test_g.safetensors.generation/x.safetensors"), used)


def test_find_unused_splits_goldens_from_other_files(tmp_path: Path) -> None:
    write_golden(tmp_path / "t.py/test_gone.safetensors", {"x": flatten(torch.ones(2), "x")}, {})
    safetensors.torch.save_file({"w": torch.ones(2)}, str(tmp_path / "t.py/weights.safetensors"))
    found = find_unused(tmp_path, set(), [PurePosixPath(".")])
    assert found.goldens == [PurePosixPath("t.py/test_gone.safetensors")]
    assert found.left_alone == [PurePosixPath("t.py/weights.safetensors")]


def test_a_partial_run_never_prunes_a_file_the_older_layout_may_share(tmp_path: Path) -> None:
    # tests/sub/test_x.safetensors: tests/sub.py::test_x (older layout) or tests/sub/<file>
    for name in ("tests/sub/test_x.safetensors", "tests/sub/test_m.py/test_y.safetensors"):
        write_golden(tmp_path / name, {"x": flatten(torch.ones(2), "x")}, {})
    partial = find_unused(tmp_path, set(), [PurePosixPath("tests/sub")])
    assert partial.goldens == [PurePosixPath("tests/sub/test_m.py/test_y.safetensors")]
    whole = find_unused(tmp_path, set(), [PurePosixPath(".")])
    assert len(whole.goldens) == 2
