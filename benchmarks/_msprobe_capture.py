"""msprobe's L1 statistics dump of the benchmark's HF Llama, timed in msprobe's environment.

    MSPROBE_PYTHON benchmarks/_msprobe_capture.py WORKDIR --repeat 3 --threads 2 [--extra-path P]

Run by ``capture_overhead.py`` with a Python that has ``mindstudio-probe`` (msprobe is not a
dependency of pytest-precision). ``--extra-path`` is appended to ``sys.path``: the benchmark
environment's site-packages, for ``transformers`` when msprobe's environment lacks it (msprobe's
own torch stays first). Prints one JSON line: the fastest bare forward, measured in this process
before msprobe hooks anything, and the fastest whole msprobe block (``start``, the forward,
``stop`` and ``step``, which writes the step's ``dump.json``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import torch


def _seconds(run: object) -> float:
    assert callable(run)
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("workdir", type=Path)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--extra-path", action="append", default=[])
    args = parser.parse_args()
    sys.path.extend(args.extra_path)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import _hf_llama

    torch.set_num_threads(args.threads)
    model = _hf_llama.build()
    ids = _hf_llama.input_ids(args.seq)
    with torch.no_grad():
        model(ids)  # warm-up
        bare = min(_seconds(lambda: model(ids)) for _ in range(args.repeat))

    dump = args.workdir / "dump"
    config = {
        "task": "statistics",
        "dump_path": str(dump),
        "rank": [],
        "step": [],
        "level": "L1",
        "statistics": {"scope": [], "list": [], "data_mode": ["all"]},
    }
    config_path = args.workdir / "config.json"
    config_path.write_text(json.dumps(config))
    from msprobe.pytorch import PrecisionDebugger

    debugger = PrecisionDebugger(config_path=str(config_path))

    def dumped() -> None:
        debugger.start(model)
        with torch.no_grad():
            model(ids)
        debugger.stop()
        debugger.step()

    times = []
    for _ in range(args.repeat + 1):  # the first start also hooks torch's API: not counted
        times.append(_seconds(dumped))
        records = sum(1 for _ in dump.rglob("dump.json"))
        shutil.rmtree(dump, ignore_errors=True)
    print(json.dumps({"bare": bare, "msprobe": min(times[1:]), "dumps": records}))


if __name__ == "__main__":
    main()
