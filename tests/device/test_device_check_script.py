"""``scripts/device_check.sh`` in CI: its CPU part runs, the device part skips with a one-line
reason, and the figures land in the one file asked for (a table, then the JSON)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from device_helpers import ACCELERATOR

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_cpu_part_runs_and_the_device_part_skips_with_a_reason(tmp_path: Path) -> None:
    out = tmp_path / "figures" / "device-check.md"
    command = ["bash", str(ROOT / "scripts" / "device_check.sh"), "--out", str(out)]
    if ACCELERATOR is not None:  # the device part is the integrator's run, not CI's
        command.append("--cpu-only")
    env = {**os.environ, "PYTHON": sys.executable}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    skips = [line for line in done.stdout.splitlines() if line.startswith("SKIP device part: ")]
    assert len(skips) == 1
    assert len(skips[0]) > len("SKIP device part: ")
    text = out.read_text()
    assert "| figure | device | value | unit | note |" in text
    record = json.loads(text.split("```json\n", 1)[1].split("\n```", 1)[0])
    assert record["device"] is None
    assert record["skipped"]
    assert record["device_tests_collected"] >= 8
    names = [f["name"] for f in record["figures"]]
    assert any(n.startswith("capture (statistics") for n in names)
    assert any(n.startswith("compare_dumps") for n in names)
    assert any(n.startswith("replay_op") for n in names)
