"""A dump comparison spread over xdist workers against the same comparison in one process.

Two pairs of dumps (``--case``):
  * ``ranks`` (default): a simulated tensor-parallel run (``tests/tp_dumps.py``), 32 ranks,
    4 decode steps, 8 layers of small tensors, one weight off on rank 5 (the error reaches
    every rank, so most ops fail and are rerun): many records, each cheap, so one process
    spends its time in per-record work on one core;
  * ``model``: tensor dumps (mix level) of a Llama-style decoder, fp32 golden and bf16
    target (every op drifts and is rerun in float64): big tensors, whose metric kernels and
    float64 reruns already keep every core busy in one process.
Then times, each as a fresh process:
  * ``pytest --precision-compare G T`` (serial: one process measures every shard; baseline),
  * ``pytest --precision-compare G T -n N`` (N xdist workers; the controller judges),
  * ``pytest-precision compare G T`` (the CLI: no pytest, no shards),
and checks that both pytest runs wrote the same JSON report. Process start (torch imported by
each worker) is included: it is what a user waits for. Bytecode caching is on for the runs
(``PYTHONDONTWRITEBYTECODE`` unset, one untimed warm-up run each), as on a user's machine:
without it every worker compiles every module, and pytest rewrites the plugin's, at each start.

    python benchmarks/compare_distributed.py [--case ranks|model] [--workers 2] [--repeat 2]
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the simulated ranks

from tp_dumps import Bug, write_tp_dump

from examples.tiny_llama import TinyLlamaConfig, build_tiny_llama, example_input_ids
from pytest_precision import ShardedComparison, capture


def _model_dumps(folder: Path, layers: int, seq: int) -> tuple[Path, Path]:
    config = TinyLlamaConfig(
        vocab_size=8000, hidden_size=512, intermediate_size=1376, num_layers=layers,
        num_heads=8, num_kv_heads=8,
    )  # fmt: skip
    paths = []
    for name, dtype in (("golden", torch.float32), ("target", torch.bfloat16)):
        model = build_tiny_llama(config, dtype=dtype)
        with torch.no_grad(), capture(model, folder / name, level="mix", mode="tensor"):
            model(example_input_ids(config, seq=seq))
        paths.append(folder / name)
    return paths[0], paths[1]


def _rank_dumps(folder: Path, ranks: int, layers: int) -> tuple[Path, Path]:
    shape = {"ranks": ranks, "steps": 4, "layers": layers}
    golden = write_tp_dump(folder / "golden", **shape)
    return golden, write_tp_dump(folder / "target", **shape, bug=Bug("weight", 5, 0))


def _seconds(command: list[str], cwd: Path) -> tuple[float, float]:
    """Wall seconds, and CPU seconds of the process and every process it waited for (xdist's
    workers included)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode not in (0, 1):  # 1: records differ (bf16), which is expected
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stdout}\n{done.stderr}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return seconds, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=["ranks", "model"], default="ranks")
    parser.add_argument("--ranks", type=int, default=32, help="simulated ranks (--case ranks)")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--seq", type=int, default=512, help="tokens (--case model)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        if args.case == "model":
            golden, target = _model_dumps(folder, args.layers, args.seq)
        else:
            golden, target = _rank_dumps(folder, args.ranks, args.layers)
        size = sum(p.stat().st_size for p in folder.rglob("*.safetensors")) / 2**20
        comparison = ShardedComparison(golden, target)
        records = len(comparison.aligned.target.records)
        print(
            f"case {args.case}: {len(comparison.shards)} shards, {records} target records, "
            f"{size:.0f} MiB of tensors"
        )
        python = sys.executable
        plugin = [python, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--tb=no"]
        plugin += ["--precision-compare", str(golden), str(target)]
        runs = {
            "serial": [*plugin, "--precision-compare-json", "serial.json"],
            f"-n {args.workers}": [
                *plugin, "-n", str(args.workers), "--precision-compare-json", "xdist.json"
            ],
            "cli": [python, "-m", "pytest_precision.cli", "compare", str(golden), str(target)],
        }  # fmt: skip
        for command in runs.values():  # warm-up: bytecode caches, numba's kernel cache
            _seconds(command, folder)
        best = dict.fromkeys(runs, (float("inf"), 0.0))
        for _ in range(args.repeat):  # interleaved: load on the machine hits every run alike
            for name, command in runs.items():
                best[name] = min(best[name], _seconds(command, folder))
        same = (folder / "serial.json").read_text() == (folder / "xdist.json").read_text()
    print(f"load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    for name, (seconds, cpu) in best.items():
        label = "pytest-precision compare (cli)" if name == "cli" else f"pytest {name}"
        print(f"  {label:>31}: {seconds:6.2f} s wall, {cpu:6.2f} s CPU")
    xdist = f"-n {args.workers}"
    ratio = best["serial"][0] / best[xdist][0]
    print(f"{xdist} vs serial (baseline): {ratio:.2f}x faster; same report: {same}")
    print(f"{xdist} vs the cli: {best['cli'][0] / best[xdist][0]:.2f}x")


if __name__ == "__main__":
    main()
