"""The ``replay`` marker and ``replay_case`` fixture, and ``pytest-precision export-test``, run
in real pytest subprocesses on captures of the tiny Llama."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from replay_helpers import BrokenOp, capture_llama

from pytest_precision import DumpFormatError, load_dump
from pytest_precision.cli import main
from pytest_precision.plugin._replay import SessionDumps
from pytest_precision.runtime._devices import available_devices

SILU_0 = "Functional.silu.0.forward"
SILUS = (SILU_0, "Functional.silu.1.forward")

CASES = """
import pytest


@pytest.mark.replay("dumps/clean", ops="Functional.linear.*")
def test_linear(replay_case):
    replay_case.check()


@pytest.mark.replay(
    "../sub/dumps/clean",  # the same dump as above, spelled otherwise: read once all the same
    ops=["Functional.silu.*", "Functional.softmax.0.forward"],
    devices=["cpu", "cuda"],
)
def test_listed(replay_case):
    assert replay_case.check().verdict == "noise"


@pytest.mark.replay("dumps/context", ops="Functional.softmax.*", devices="cpu")
def test_context(replay_case):
    replay_case.check()
"""


#: Counts, per process, the call indexes (collection), the dumps (cases) and the tensors read,
#: at the end of collection and of the session, in ``reads-<worker>-<when>.json``.
COUNTING_CONFTEST = """
import json

import pytest_precision.dump._call_index as call_index
import pytest_precision.dump._load as load
import pytest_precision.dump._native as native

indexes, dumps, tensors = [], [], []
read_index, read_dump = call_index._native_index, load.read_native_dump
read_tensor = native.load_safetensors_tensor


def counting_index(path):
    indexes.append(path.name)
    return read_index(path)


def counting_dump(path):
    dumps.append(path.name)
    return read_dump(path)


def counting_tensor(shard, key):
    tensors.append(key)
    return read_tensor(shard, key)


call_index._native_index = counting_index
load.read_native_dump = counting_dump
native.load_safetensors_tensor = counting_tensor


def _save(config, when):
    # not PYTEST_XDIST_WORKER: this run may itself be inside an xdist worker
    worker = getattr(config, "workerinput", {}).get("workerid", "main")
    reads = {"indexes": sorted(indexes), "dumps": sorted(dumps), "tensors": len(tensors)}
    (config.rootpath / f"reads-{worker}-{when}.json").write_text(json.dumps(reads))


def pytest_collection_finish(session):
    _save(session.config, "collection")


def pytest_sessionfinish(session):
    _save(session.config, "session")
"""


def reads(project: pytest.Pytester, when: str) -> dict[str, dict[str, object]]:
    """What each process read, by worker (``main`` without xdist)."""
    files = project.path.glob(f"reads-*-{when}.json")
    return {f.name.split("-")[1]: json.loads(f.read_text()) for f in files}


@pytest.fixture(scope="module")
def captures(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``clean``, ``context`` (layer 1's softmax kernel skewed while recording) and
    ``statistics`` captures."""
    root = tmp_path_factory.mktemp("captures")
    capture_llama(root / "clean")
    capture_llama(root / "context", broken=BrokenOp())
    capture_llama(root / "statistics", mode="statistics")
    return root


@pytest.fixture
def project(pytester: pytest.Pytester, captures: Path) -> pytest.Pytester:
    """A test file in a subfolder, with its dumps beside it (paths relative to the file)."""
    for name in ("clean", "context"):
        shutil.copytree(captures / name, pytester.path / "sub" / "dumps" / name)
    (pytester.path / "sub" / "test_cases.py").write_text(CASES)
    (pytester.path / "conftest.py").write_text(COUNTING_CONFTEST)
    return pytester


def test_the_marker_makes_one_case_per_call_and_device(
    project: pytest.Pytester, captures: Path
) -> None:
    linear = sorted(
        (c.name for c in load_dump(captures / "clean").calls if c.name.startswith("Functional.l")),
        key=lambda name: int(name.split(".")[2]),
    )
    assert len(linear) == 15  # 7 per layer and the head
    devices = [backend.name for backend in available_devices()]
    result = project.runpytest_subprocess("-p", "no:cacheprovider", "--collect-only", "-q")
    ids = [line for line in result.stdout.lines if "::" in line]
    expected_linear = [f"sub/test_cases.py::test_linear[{n}-{d}]" for n in linear for d in devices]
    listed = [
        f"sub/test_cases.py::test_listed[{name}-{device}]"
        for name in ("Functional.softmax.0.forward", *SILUS)
        for device in ("cpu", "cuda")
    ]
    assert ids[: len(expected_linear)] == expected_linear
    assert sorted(ids[len(expected_linear) : -2]) == sorted(listed)
    assert ids[-2:] == [
        "sub/test_cases.py::test_context[Functional.softmax.0.forward-cpu]",
        "sub/test_cases.py::test_context[Functional.softmax.1.forward-cpu]",
    ]
    # three markers, two dumps: each index read once, no dump and no tensor (the cases read them)
    assert reads(project, "collection") == {
        "main": {"indexes": ["clean", "context"], "dumps": [], "tensors": 0}
    }


@pytest.mark.parametrize("args", [[], ["-n", "2"]], ids=["serial", "xdist"])
def test_cases_run_skip_and_warn(project: pytest.Pytester, args: list[str]) -> None:
    cuda = any(backend.name == "cuda" for backend in available_devices())
    result = project.runpytest_subprocess("-p", "no:cacheprovider", "-rs", *args)
    linear = 15 * len(available_devices())
    skipped = 0 if cuda else 3
    result.assert_outcomes(passed=linear + 6 - skipped + 2, skipped=skipped, warnings=1)
    if not cuda:
        result.stdout.fnmatch_lines(["SKIPPED [[]3[]] *: cuda is not available: *"])
    # the context case passes, with the report as a PrecisionWarning
    result.stdout.fnmatch_lines(
        [
            "*test_context?Functional.softmax.1.forward-cpu?*",
            "*PrecisionWarning: replay Functional.softmax.1.forward (step 0, rank 0) on cpu: "
            "context",
        ]
    )
    # every process read each index once, at collection, and each dump its cases ran on once
    workers = ["gw0", "gw1"] if args else ["main"]
    at_collection, at_end = reads(project, "collection"), reads(project, "session")
    assert sorted(at_collection) == workers  # xdist's controller collects nothing
    for worker in workers:
        assert at_collection[worker] == {
            "indexes": ["clean", "context"],
            "dumps": [],
            "tensors": 0,
        }
        assert at_end[worker]["indexes"] == ["clean", "context"]
        assert len(set(at_end[worker]["dumps"])) == len(at_end[worker]["dumps"])
    assert {d for read in at_end.values() for d in read["dumps"]} == {"clean", "context"}
    assert sum(read["tensors"] for read in at_end.values()) > 0  # the count counts


def test_a_session_reads_a_dump_once_until_it_is_replaced(tmp_path: Path, captures: Path) -> None:
    dump = tmp_path / "dump"
    shutil.copytree(captures / "context", dump)
    (tmp_path / "link").symlink_to(dump)
    dumps = SessionDumps()
    first = dumps.get(str(dump))
    assert dumps.get(str(tmp_path / "." / "dump")) is first
    assert dumps.get(str(tmp_path / "link")) is first
    shutil.rmtree(dump)
    shutil.copytree(captures / "clean", dump)  # another capture under the same name
    second = dumps.get(str(dump))
    assert second is not first
    assert dumps.get(str(dump)) is second


def test_the_session_indexes_a_dump_once_apart_from_reading_it(captures: Path) -> None:
    dumps = SessionDumps()
    index = dumps.index(str(captures / "clean"))
    assert dumps.index(str(captures / "." / "clean")) is index
    dump = dumps.get(str(captures / "clean"))
    assert [(c.name, c.step, c.rank) for c in index.calls] == [
        (c.name, c.step, c.rank) for c in dump.calls
    ]


def test_the_session_reads_a_damaged_dump_once(
    tmp_path: Path, captures: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pytest_precision.dump import _load

    dump = tmp_path / "dump"
    shutil.copytree(captures / "clean", dump)
    (dump / "rank0" / "rank.json").unlink()
    calls, read = [], _load.load_dump
    monkeypatch.setattr(_load, "load_dump", lambda path: calls.append(path) or read(path))
    dumps = SessionDumps()
    for _ in range(3):
        with pytest.raises(DumpFormatError, match="rank 0 never finalized"):
            dumps.get(str(dump))
    assert len(calls) == 1


def test_collecting_cpu_cases_of_a_native_dump_imports_no_torch(
    pytester: pytest.Pytester, captures: Path
) -> None:
    shutil.copytree(captures / "clean", pytester.path / "dump")
    pytester.makeconftest(
        "import sys\n\n\ndef pytest_collection_finish(session):\n"
        "    print('torch imported:', 'torch' in sys.modules)\n"
    )
    pytester.makepyfile(
        '@__import__("pytest").mark.replay("dump", ops="Functional.silu.*", devices="cpu")\n'
        "def test_it(replay_case):\n    replay_case.check()\n"
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--collect-only", "-q", "-s")
    result.stdout.fnmatch_lines(["torch imported: False", "2 tests collected*"])


def test_a_dump_damaged_past_its_index_fails_its_cases_in_one_line(
    pytester: pytest.Pytester, captures: Path
) -> None:
    dump = pytester.path / "dump"
    shutil.copytree(captures / "clean", dump)
    records = dump / "rank0" / "records.jsonl"
    lines = records.read_text().splitlines(keepends=True)
    damaged = next(i for i, line in enumerate(lines) if '"dtype":"float32"' in line)
    lines[damaged] = lines[damaged].replace('"dtype":"float32"', '"dtype":"float99"', 1)
    records.write_text("".join(lines))
    pytester.makepyfile(
        '@__import__("pytest").mark.replay("dump", ops="Functional.silu.*", devices="cpu")\n'
        "def test_it(replay_case):\n    replay_case.check()\n"
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(failed=2)  # collected from the index; each case says what is wrong
    result.stdout.fnmatch_lines(
        ["*cannot replay Functional.silu.0.forward: *records.jsonl:*: unknown dtype 'float99'"]
    )
    assert "Traceback" not in result.stdout.str()


BAD_MARKERS = {
    "test_no_dump.py": '@pytest.mark.replay("missing", ops="*")',
    "test_no_match.py": '@pytest.mark.replay("dumps/clean", ops="Functional.nothing.*")',
    "test_no_marker.py": "",
    "test_bad_ops.py": '@pytest.mark.replay("dumps/clean", ops=5)',
    "test_bad_keyword.py": '@pytest.mark.replay("dumps/clean", opz="*")',
}


def test_a_bad_marker_is_a_collection_error(project: pytest.Pytester) -> None:
    for name, marker in BAD_MARKERS.items():
        test = f"import pytest\n\n{marker}\ndef test_it(replay_case):\n    replay_case.check()\n"
        (project.path / "sub" / name).write_text(test)
    (project.path / "sub" / "test_no_fixture.py").write_text(
        'import pytest\n\n@pytest.mark.replay("missing")\ndef test_it():\n    pass\n'
    )
    result = project.runpytest_subprocess(
        "-p", "no:cacheprovider", *(f"sub/{name}" for name in BAD_MARKERS), "sub/test_no_fixture.py"
    )
    result.assert_outcomes(errors=6)
    result.stdout.fnmatch_lines_random(
        [
            "*sub/test_no_dump.py::test_it: @pytest.mark.replay: *missing*",
            "*sub/test_no_match.py::test_it: @pytest.mark.replay: no op call of *clean matches "
            "Functional.nothing.* (op calls: *",
            "*sub/test_no_marker.py::test_it: the replay_case fixture needs "
            "@pytest.mark.replay(dump, ops=...) on the test",
            "*sub/test_bad_ops.py::test_it: @pytest.mark.replay: ops must be a glob or a list "
            "of globs, got 5",
            "*sub/test_bad_keyword.py::test_it: @pytest.mark.replay: replay() got an unexpected "
            "keyword argument 'opz' (signature: *",
            "*sub/test_no_fixture.py::test_it: @pytest.mark.replay needs the test to request "
            "the replay_case fixture",
        ]
    )
    assert "Traceback" not in result.stdout.str()
    assert "During handling" not in result.stdout.str()
    assert "def generate" not in result.stdout.str()


# -- export-test ---------------------------------------------------------------------------------

BROKEN_SILU_CONFTEST = """
import torch
import torch.nn.functional as F

right = F.silu


def broken(x, inplace=False):
    # a low-precision kernel bug; float64, the reference, takes the right path
    out = right(x)
    return out if x.dtype == torch.float64 else out * 1.01


F.silu = broken
"""


def test_export_test_round_trip(pytester: pytest.Pytester, captures: Path) -> None:
    test_file = pytester.path / "mail" / "test_silu.py"
    test_file.parent.mkdir()  # export-test refuses a missing folder rather than guess
    dump, args = captures / "clean", ["-o", str(test_file), "--golden", str(captures / "clean")]
    assert main(["export-test", str(dump), SILU_0, *args]) == 0
    mini = load_dump(test_file.with_name("test_silu_dump"))
    assert [c.name for c in mini.calls] == [SILU_0]
    assert [c.name for c in load_dump(test_file.with_name("test_silu_golden")).calls] == [SILU_0]
    original = next(c for c in load_dump(dump).calls if c.name == SILU_0)
    assert [r.slot for r in mini.calls[0].records] == [r.slot for r in original.records]
    assert sum(f.stat().st_size for f in test_file.parent.rglob("*") if f.is_file()) < 64 << 10

    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "mail")
    result.assert_outcomes(passed=1)

    (pytester.path / "mail" / "conftest.py").write_text(BROKEN_SILU_CONFTEST)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "mail")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            f"*AssertionError: replay {SILU_0} (step 0, rank 0) on cpu: op-bug",
            "*reason:  the op rerun alone on cpu lands outside float32 rounding*",
            "*golden: pass, cosine *",
        ]
    )


def test_export_test_refuses_to_overwrite(
    tmp_path: Path, captures: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["export-test", str(captures / "clean"), SILU_0, "-o", str(tmp_path / "test_op.py")]
    assert main(args) == 0
    first = (tmp_path / "test_op.py").read_text()
    capsys.readouterr()
    assert main(args) == 2
    assert "already exist(s); pass --force to overwrite" in capsys.readouterr().err
    assert main([*args, "--force"]) == 0
    assert (tmp_path / "test_op.py").read_text() == first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["test_op.py", "test_op_dump"]
    module = "Module.model.LlamaModel.forward.0"
    assert main([*args[:2], module, "-o", str(tmp_path / "test_module.py")]) == 2
    assert "is a module's forward, not an op" in capsys.readouterr().err
    assert not (tmp_path / "test_module_dump").exists()


def test_export_test_never_overwrites_the_dump_it_reads(
    tmp_path: Path, captures: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import shutil

    source = tmp_path / "npu_dump"
    shutil.copytree(captures / "clean", source)
    args = ["export-test", str(source), SILU_0, "-o", str(tmp_path / "npu.py"), "--force"]
    assert main(args) == 2
    assert "would overwrite the dump it exports from" in capsys.readouterr().err
    assert load_dump(source).calls  # intact


def test_export_test_refuses_a_statistics_dump(
    tmp_path: Path, captures: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["export-test", str(captures / "statistics"), SILU_0, "-o", str(tmp_path / "t.py")]
    assert main(args) == 2
    assert "statistics-only dump" in capsys.readouterr().err
    assert not (tmp_path / "t.py").exists()
