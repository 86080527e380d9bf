"""Collection cost of the ``replay`` marker: 10,000 replay cases against 10,000 plain cases.

A native dump of ``--calls`` op calls (small float32 tensors, recorded by ``capture``) is
written once; then ``pytest --collect-only -q`` runs, each time in a fresh process, on

- ``plain``: one test with ``@pytest.mark.parametrize`` over as many values (the baseline);
- ``plain+torch``: the same, in a test file that imports torch (what collection cost while
  the replay marker imported torch to read the dump and list the devices);
- ``replay``: one test with ``@pytest.mark.replay(dump, devices="cpu")`` over the dump;
- ``replay x2``: two such tests on the same dump (the index must be read once, not per marker),
  and ``plain+torch x2``, twice the plain cases in a test file importing torch.

Runs are interleaved and the best of ``--repeat`` is kept: the least disturbed by other load;
CPU seconds (the process's own) vary less than wall seconds on a shared machine. Target:
replay / plain <= 1.3. Collection reads a native dump's JSON index without importing torch
(``devices="cpu"`` needs none either): what ``replay`` costs beyond ``plain`` is mostly parsing
that index, three JSON lines per call. ``replay x2`` shows that a second marker on the same
dump costs only its cases.

    python benchmarks/replay_collection.py [--calls 10000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from pytest_precision import capture

PLAIN = """
import pytest


@pytest.mark.parametrize("case", range({calls}))
def test_plain(case):
    pass
"""

PLAIN_TORCH = "import torch\n" + PLAIN

REPLAY = """
import pytest


@pytest.mark.replay("dump", devices="cpu")
def test_replay(replay_case):
    replay_case.check()
"""

REPLAY_TWICE = (
    REPLAY
    + """

@pytest.mark.replay("dump", ops="*", devices="cpu")
def test_replay_again(replay_case):
    replay_case.check()
"""
)

PLAIN_TORCH_TWICE = PLAIN_TORCH + PLAIN.replace("test_plain", "test_plain_again")

#: What is compared with what: the target is the first pair's ratio <= 1.3.
PAIRS = (("replay", "plain"), ("replay", "plain+torch"), ("replay x2", "plain+torch x2"))


class _ManyOps(torch.nn.Module):
    """``calls`` op calls on 8-element tensors, alternating two replayable ops."""

    def __init__(self, calls: int) -> None:
        super().__init__()
        self.calls = calls

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for number in range(self.calls):
            x = torch.nn.functional.silu(x) if number % 2 else torch.add(x, 1.0)
        return x


def write_dump(path: Path, calls: int) -> None:
    model = _ManyOps(calls)
    with torch.no_grad(), capture(model, path, level="op", mode="tensor"):
        model(torch.linspace(-1, 1, 8))


def _file(label: str) -> str:
    return f"test_{label.replace('+', '_').replace(' ', '_')}.py"


def _collect(project: Path, label: str) -> tuple[float, float, int]:
    """Wall and CPU seconds of one ``pytest --collect-only -q`` process, and its case count."""
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only", "-q"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(
        [*command, _file(label)], cwd=project, check=True, capture_output=True, text=True
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return wall, cpu, sum("::" in line for line in done.stdout.splitlines())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=5)
    options = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="replay-collection-") as folder:
        project = Path(folder)
        (project / "pytest.ini").write_text("[pytest]\n")
        write_dump(project / "dump", options.calls)
        files = {
            "plain": PLAIN,
            "plain+torch": PLAIN_TORCH,
            "replay": REPLAY,
            "plain+torch x2": PLAIN_TORCH_TWICE,
            "replay x2": REPLAY_TWICE,
        }
        for label, text in files.items():
            (project / _file(label)).write_text(text.format(calls=options.calls))
        wall: dict[str, float] = {}
        cpu: dict[str, float] = {}
        for _ in range(options.repeat):  # interleaved: load on the machine hits all alike
            for label in files:
                seconds, cpu_seconds, cases = _collect(project, label)
                expected = options.calls * (2 if "x2" in label else 1)
                if cases != expected:
                    raise SystemExit(f"{label}: collected {cases} cases, expected {expected}")
                wall[label] = min(wall.get(label, seconds), seconds)
                cpu[label] = min(cpu.get(label, cpu_seconds), cpu_seconds)
        print(f"pytest --collect-only -q, {options.calls} op calls, best of {options.repeat}")
        print(f"  {'':14} {'wall':>7} {'cpu':>7}")
        for label in files:
            print(f"  {label:14} {wall[label]:6.2f}s {cpu[label]:6.2f}s")
        for label, baseline in PAIRS:
            print(
                f"ratio {label} / {baseline}: {wall[label] / wall[baseline]:.2f}x wall, "
                f"{cpu[label] / cpu[baseline]:.2f}x cpu"
            )


if __name__ == "__main__":
    main()
