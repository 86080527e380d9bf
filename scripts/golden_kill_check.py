"""kill -9 a real ``pytest --golden-update`` at random moments; every golden must stay whole.

Each round runs pytest on a small test project whose values carry the round number, kills it
with SIGKILL after a random delay, and reads every golden back: it must load, hold one version
only, and be either the old version or this round's. Prints how many kills landed inside a
write (a temp file was left behind) and exits non-zero on any torn or mixed file.

    python scripts/golden_kill_check.py [--rounds 50] [--seed 0]
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pytest_precision.golden._files import read_golden
from pytest_precision.golden._layout import golden_relpath, list_stale_temps

TESTS = 4
TEST_FILE = f"""
import os

import pytest
import torch

from pytest_precision import assert_close_to_golden

VERSION = float(os.environ["GOLDEN_VERSION"])
SIDE = int(os.environ["GOLDEN_SIDE"])


@pytest.mark.parametrize("i", range({TESTS}))
def test_layer(i):
    assert_close_to_golden(torch.full((SIDE, SIDE), VERSION), name="out", standard="exact")
"""


def _run(project: Path, version: int, side: int, *extra: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "GOLDEN_VERSION": str(version), "GOLDEN_SIDE": str(side)}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *extra]
    command += ["--golden-dir", "goldens", "--golden-update"]
    return subprocess.Popen(
        command, cwd=project, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


def _version(path: Path) -> int | None:
    if not path.exists():
        return None
    value = read_golden(path).value("out")
    first = value.flatten()[0]
    if not bool(value.eq(first).all()):
        raise AssertionError(f"{path} mixes two versions")
    return int(first)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--side", type=int, default=2048, help="each golden is SIDE x SIDE fp32")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        project = Path(tmp)
        (project / "test_kill.py").write_text(TEST_FILE)
        paths = [
            project / "goldens" / golden_relpath(f"test_kill.py::test_layer[{i}]")
            for i in range(TESTS)
        ]
        start = time.perf_counter()
        if _run(project, 0, args.side).wait() != 0:
            print("the recording run failed", file=sys.stderr)
            return 1
        full_run = time.perf_counter() - start
        start = time.perf_counter()
        _run(project, 0, args.side, "-k", "no_such_test").wait()
        startup = time.perf_counter() - start  # kills before this land before any write
        versions = [_version(p) for p in paths]
        mid_write = partial = torn = 0
        for version in range(1, args.rounds + 1):
            process = _run(project, version, args.side)
            time.sleep(rng.uniform(0.9 * startup, full_run))
            process.send_signal(signal.SIGKILL)
            process.wait()
            stale = list_stale_temps(project / "goldens")
            mid_write += bool(stale)
            for temp in stale:
                temp.unlink()
            before = list(versions)
            for i, path in enumerate(paths):
                try:
                    now = _version(path)
                except Exception as exc:
                    print(f"round {version}: {path.name}: {exc}")
                    torn += 1
                    continue
                if now not in (versions[i], version):
                    print(f"round {version}: {path.name} holds version {now}")
                    torn += 1
                versions[i] = now
            partial += len({v == version for v in versions}) > 1 and before != versions
    print(
        f"{args.rounds} kills of pytest --golden-update (startup {startup:.2f} s, full run "
        f"{full_run:.2f} s): {mid_write} left a temp file (killed inside a write), {partial} "
        f"between two tests' writes, {torn} torn or foreign goldens"
    )
    return 1 if torn else 0


if __name__ == "__main__":
    raise SystemExit(main())
