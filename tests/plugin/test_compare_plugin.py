"""``pytest --precision-compare GOLDEN TARGET``: one test per shard, one judgement across all
shards. Serial, on xdist workers (``-n 2``) and on ``--tx popen`` workers started elsewhere, the
session writes the report ``compare_dumps`` gives; a planted bug fails exactly its shard; a
worker reads only its shards' tensors. On simulated tensor-parallel dumps (``tp_dumps.py``)."""

from __future__ import annotations

import gc
import json
import sys
from pathlib import Path

import pytest
import torch
from compare_helpers import CONFIG, dump_llama
from tp_dumps import Bug, shard_data, write_tp_dump

from examples.tiny_llama import build_tiny_llama
from pytest_precision import ShardedComparison, compare_dumps
from pytest_precision.plugin import _compare
from pytest_precision.report import write_json

PLANTED = "precision-compare::step1-rank1-layers.1"

#: A plugin (``-p readlog``: conftest hooks apply only to tests under their folder) that logs
#: every tensor a process reads from a native dump, with the test running it (None: outside
#: any test), one file per process.
READ_LOG = """
import json, os
import pytest
from pytest_precision.dump import _native

running = [None]
load = _native._load


def logged(shard, key, *args):
    with open(os.path.join({log!r}, f"{{os.getpid()}}.jsonl"), "a") as f:
        data = f"{{shard.parent.name.removeprefix('rank')}}/{{shard.name}}/{{key}}"
        f.write(json.dumps([running[0], data]) + "\\n")
    return load(shard, key, *args)


_native._load = logged


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    running[0] = item.nodeid
    try:
        return (yield)
    finally:
        running[0] = None
"""


@pytest.fixture(scope="module")
def tp(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """2 ranks, 2 steps, 2 layers; rank 1's last residual add computes wrong at step 1."""
    root = tmp_path_factory.mktemp("tp")
    golden = write_tp_dump(root / "golden", ranks=2, steps=2, layers=2)
    bug = Bug("kernel", rank=1, layer=1, step=1)
    return golden, write_tp_dump(root / "target", ranks=2, steps=2, layers=2, bug=bug)


def _expected(golden: Path, target: Path, path: Path) -> object:
    write_json(compare_dumps(golden, target), path)
    return json.loads(path.read_text())


def test_the_session_is_the_comparison_and_its_report(
    pytester: pytest.Pytester, tp: tuple[Path, Path]
) -> None:
    golden, target = tp
    pytester.makepyfile(test_unrelated="def test_not_collected():\n    assert False\n")
    result = pytester.runpytest(
        "--precision-compare", str(golden), str(target), "--precision-compare-json", "c.json",
        "--precision-compare-html", "pages/c.html",
    )  # fmt: skip
    result.assert_outcomes(passed=11, failed=1)  # only the shards: not test_unrelated.py
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        [
            f"*_ {PLANTED} _*",
            "step 1, rank 1, layer layers.1: 1 call is guilty on its own records "
            "(2 of 10 records fail the standard)",
            "  Tensor.add.1.forward [[]layers.1]: float64 rerun",
            "    output.0 differs from a rerun of the call from its own recorded inputs*",
            "*= dump comparison (pytest-precision) =*",
            "first divergence: Tensor.add.1.forward, step 1 rank 1",
            "*rule:   float64 rerun",
            f"first divergence in shard {PLANTED}",
            "judged across 12 shards measured by their tests (measured while judging: 0)",
        ]
    )
    written = json.loads((pytester.path / "c.json").read_text())
    assert written == _expected(golden, target, pytester.path / "expected.json")
    page = (pytester.path / "pages" / "c.html").read_text()  # the folder made, as --json does
    assert page.startswith("<!DOCTYPE html>")
    assert "Tensor.add.1.forward" in page


def test_a_comparison_that_is_incomplete_fails_with_every_shard_passing(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    """The target holds a decode step the golden lacks: no record fails, the verdict does."""
    golden = write_tp_dump(tmp_path / "g", ranks=1, steps=1, layers=1)
    target = write_tp_dump(tmp_path / "t", ranks=1, steps=2, layers=1)
    result = pytester.runpytest("--precision-compare", str(golden), str(target))
    result.assert_outcomes(passed=4)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["incomplete: step 1 rank 0 is only in the target*"])


def test_a_run_that_differs_only_by_noise_passes(pytester: pytest.Pytester, tmp_path: Path) -> None:
    """The tiny Llama in bf16 against fp32: records fail the standard (carried rounding), no
    call is guilty. Every shard passes and so does the session, as ``compare`` exits 0."""
    golden = dump_llama(tmp_path / "g", build_tiny_llama(CONFIG), "tensor")
    bf16 = build_tiny_llama(CONFIG, dtype=torch.bfloat16)
    target = dump_llama(tmp_path / "t", bf16, "tensor")
    result = pytester.runpytest("--precision-compare", str(golden), str(target))
    result.assert_outcomes(passed=3)
    assert result.ret == pytest.ExitCode.OK
    # how many records fail depends on the CPU's bf16 kernels; that some do, does not
    result.stdout.fnmatch_lines(
        ["no divergence: * record(s) differ beyond the standard, but no call is guilty:*"]
    )


def test_the_session_gives_the_garbage_collector_back_what_it_froze(
    pytester: pytest.Pytester, tp: tuple[Path, Path]
) -> None:
    """The index is frozen out of the collector's reach for the session, not for this
    process (the run below is in-process): nothing stays frozen, the comparison is let go."""
    golden, target = tp
    pytester.makeconftest(
        "import gc\n\n\ndef pytest_runtestloop(session):\n"
        "    session.config._frozen_while_running = gc.get_freeze_count()\n"
    )
    recorder = pytester.inline_run("--precision-compare", str(golden), str(target))
    config = recorder.getcalls("pytest_unconfigure")[0].config
    assert config._frozen_while_running > 0
    assert gc.get_freeze_count() == 0
    assert _compare._COMPARISON_KEY not in config.stash


def test_a_partial_run_is_not_judged(pytester: pytest.Pytester, tp: tuple[Path, Path]) -> None:
    golden, target = tp
    result = pytester.runpytest("--precision-compare", str(golden), str(target), "-k", "rank0")
    result.assert_outcomes(passed=6, deselected=6)
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["not judged: 6 of 12 shards were not measured*step0-rank1-*"])


def test_a_missing_dump_is_a_collection_error(
    pytester: pytest.Pytester, tp: tuple[Path, Path]
) -> None:
    result = pytester.runpytest("--precision-compare", str(tp[0]), "nowhere")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(["*--precision-compare: nowhere: no such file or directory*"])
    assert "dump comparison (pytest-precision)" not in result.stdout.str()


@pytest.mark.slow
def test_xdist_workers_measure_only_their_shards_of_64_ranks(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    """64 ranks, 2 decode steps, ``-n 2``: the report of ``compare_dumps``, and every tensor a
    process read was read by a test of the shard that holds it (none by the controller)."""
    golden = write_tp_dump(tmp_path / "g", ranks=64, steps=2, layers=1)
    target = write_tp_dump(tmp_path / "t", ranks=64, steps=2, layers=1, bug=Bug("weight", 37, 0))
    log = tmp_path / "reads"
    log.mkdir()
    pytester.makepyfile(readlog=READ_LOG.format(log=str(log)))
    result = pytester.runpytest_subprocess(
        "-p", "readlog", "-n", "2", "--precision-compare", str(golden), str(target),
        "--precision-compare-json", "c.json", "--tb=no", "-q", "-rN",
    )  # fmt: skip
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["first divergence: Functional.linear.0.forward, step 0 rank 37"])
    written = json.loads((pytester.path / "c.json").read_text())
    assert written == _expected(golden, target, tmp_path / "expected.json")
    comparison = ShardedComparison(golden, target)
    holds = {f"precision-compare::{s.id}": shard_data(comparison, s) for s in comparison.shards}
    processes = list(log.glob("*.jsonl"))
    assert len(processes) == 2  # the two workers; the controller read nothing
    for process in processes:
        for test, data in map(json.loads, process.read_text().splitlines()):
            assert test is not None, f"{data} read outside any test"
            assert data in holds[test], f"{test} read {data}, data of another shard"


@pytest.mark.slow
def test_remote_workers_elsewhere_give_the_same_report(
    pytester: pytest.Pytester, tp: tuple[Path, Path]
) -> None:
    """Two ``--tx popen`` workers, each in its own folder with the given interpreter, as on
    other machines; the dumps at the same path everywhere (shared storage), given by the
    ``precision_compare`` setting, which xdist passes on unchanged."""
    golden, target = tp
    workers = []
    for name in ("host-a", "host-b"):
        (pytester.path / name).mkdir()
        workers += ["--tx", f"popen//chdir={pytester.path / name}//python={sys.executable}"]
    result = pytester.runpytest_subprocess(
        "-d", *workers, "-o", f"precision_compare={golden} {target}",
        "--precision-compare-json", "c.json", "-rN",
    )  # fmt: skip
    result.assert_outcomes(passed=11, failed=1)
    result.stdout.fnmatch_lines([f"first divergence in shard {PLANTED}"])
    written = json.loads((pytester.path / "c.json").read_text())
    assert written == _expected(golden, target, pytester.path / "expected.json")


#: A plugin (``-p exitlog``) that logs, in xdist's controller, whether the comparison was
#: judged when the controller started waiting for its workers to exit, and in each worker how
#: many objects the collector had frozen when the worker's session ended.
EXIT_LOG = """
import gc, os
import pytest
from xdist import workermanage
from pytest_precision.plugin import _compare

teardown_nodes = workermanage.NodeManager.teardown_nodes


def logged_teardown(self):
    judged = _compare._RESULT_KEY in self.config.stash
    with open(os.path.join({log!r}, "controller"), "w") as f:
        f.write(f"judged before waiting for the workers: {{judged}}")
    return teardown_nodes(self)


workermanage.NodeManager.teardown_nodes = logged_teardown


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    if hasattr(config, "workerinput"):
        with open(os.path.join({log!r}, config.workerinput["workerid"]), "w") as f:
            f.write(f"frozen at exit: {{gc.get_freeze_count()}}")
"""


@pytest.mark.slow
def test_the_controller_judges_while_its_workers_exit(
    pytester: pytest.Pytester, tp: tuple[Path, Path], tmp_path: Path
) -> None:
    """The judgement does not wait for the workers' processes to end; a worker leaves the
    index frozen (its process ends next: the collector's last pass skips it)."""
    golden, target = tp
    pytester.makepyfile(exitlog=EXIT_LOG.format(log=str(tmp_path)))
    result = pytester.runpytest_subprocess(
        "-p", "exitlog", "-n", "1", "--precision-compare", str(golden), str(target)
    )  # fmt: skip
    result.assert_outcomes(passed=11, failed=1)
    controller = (tmp_path / "controller").read_text()
    assert controller == "judged before waiting for the workers: True"
    frozen = int((tmp_path / "gw0").read_text().removeprefix("frozen at exit: "))
    assert frozen > 10_000  # every record of both dumps, among others
