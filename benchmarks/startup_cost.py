"""Startup cost: ``pytest`` in a project that never uses pytest-precision, with it installed.

Baseline: the same run with the plugin blocked (``-p no:precision``). Each run is a fresh
process on a one-test project in a temp folder, so it measures the whole start: plugin
discovery, imports, header, collection, one test. Target: ratio <= 1.1 (before lazy imports
the plugin imported torch in every run: about 4x).

    python benchmarks/startup_cost.py [--repeat 7]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

UNRELATED_TEST = "def test_addition():\n    assert 1 + 1 == 2\n"
#: The test fails the run if these were imported: the figure is then not the lazy path's.
NO_HEAVY_IMPORTS = """\
import sys


def pytest_unconfigure(config):
    heavy = [name for name in ("torch", "numpy", "safetensors") if name in sys.modules]
    assert not heavy, f"imported {heavy}"
"""


def _seconds(project: Path, args: list[str]) -> float:
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args]
    start = time.perf_counter()
    subprocess.run(command, cwd=project, check=True, capture_output=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument(
        "--allow-heavy-imports", action="store_true", help="time a build that imports torch"
    )
    options = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="startup-bench-") as folder:
        project = Path(folder)
        (project / "pytest.ini").write_text("[pytest]\n")
        (project / "test_unrelated.py").write_text(UNRELATED_TEST)
        if not options.allow_heavy_imports:
            (project / "conftest.py").write_text(NO_HEAVY_IMPORTS)
        print("ratio = median with the plugin / median with -p no:precision (fresh processes)")
        for label, args in (("pytest -q", ["-q"]), ("pytest (header shown)", [])):
            plugin: list[float] = []
            baseline: list[float] = []
            for _ in range(options.repeat):  # interleaved: load on the machine hits both alike
                plugin.append(_seconds(project, args))
                baseline.append(_seconds(project, [*args, "-p", "no:precision"]))
            with_plugin, without = statistics.median(plugin), statistics.median(baseline)
            print(
                f"{label:<22} with plugin {with_plugin:.2f} s (min {min(plugin):.2f}), "
                f"without {without:.2f} s (min {min(baseline):.2f}), "
                f"ratio {with_plugin / without:.2f}"
            )


if __name__ == "__main__":
    main()
