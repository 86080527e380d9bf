"""Dump comparison speed: ``pytest-precision compare`` against ``msprobe compare``, side by side.

Both tools run as command-line processes (start-up included) on the same pair of dumps in
msprobe's own layout, in one run, and the script prints both times, the ratio and both tools'
peak resident memory (``ru_maxrss`` of each process, the largest process of its tree):

* ``500 x 1M``: 500 float32 tensors of 1M elements per side (250 gelu calls, an input and an
  output each; see ``_msprobe_layout.py``), every target tensor slightly different. Both tools'
  outputs are checked to hold a row for every tensor.
* ``HF Llama L1``: msprobe's own L1 tensor dump of an HF ``transformers`` Llama (8 layers, hidden
  512, 256 tokens), golden against a target whose input embeddings differ by 1e-6 relative.
  Made by msprobe in its environment; skipped (with a SKIP line) if that lacks ``transformers``.

msprobe is not a dependency: give its launcher with ``--msprobe PATH`` or put it on PATH (else
its rows print SKIP). Make its environment apart from the project's::

    python3 -m venv /tmp/msprobe-bench
    /tmp/msprobe-bench/bin/pip install torch==2.13.0 mindstudio-probe==26.2.0 transformers
    python benchmarks/compare_dumps.py --msprobe /tmp/msprobe-bench/bin/msprobe

``--size 5000`` (tensors per side) and ``--numel`` (elements per tensor, default 1M) set the
side-by-side pair: ``--size 5000`` is the pair ten times larger (42 GB on disk, written one
tensor at a time in about ten minutes). ``--tensors 500 5000`` runs our side alone on pairs of
those sizes, one after the other, each deleted before the next is written unless ``--keep``:
peak memory must stay flat as the dump grows. Before writing, the free space of the folder is
checked against the pair's size. ``--keep DIR`` keeps the dumps there for the next run (and
reuses them). A pair larger than the machine's memory is not read through before each tool:
both read it from disk. ``--native`` runs the older benchmark instead: compare_dumps on two
native tensor dumps of a Llama-style decoder against a numpy read of the same shards, for an
identical target and a bfloat16 one (every drifting op rerun in float64).

    python benchmarks/compare_dumps.py [--msprobe PATH] [--repeat 1] [--keep DIR]
    python benchmarks/compare_dumps.py --msprobe PATH --size 5000 --keep /data/bench
    python benchmarks/compare_dumps.py --tensors 500 5000
    python benchmarks/compare_dumps.py --native [--repeat 3] [--quick]
"""

from __future__ import annotations

import argparse
import csv
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _msprobe_layout import NUMEL, hf_llama_pair, pair_bytes, write_gelu_pair
from _timing import best_seconds

from examples.tiny_llama import TinyLlamaConfig, build_tiny_llama, example_input_ids
from pytest_precision import capture, compare_dumps

CONFIG = TinyLlamaConfig(
    vocab_size=8000, hidden_size=512, intermediate_size=1376, num_layers=4, num_heads=8,
    num_kv_heads=8,
)  # fmt: skip


def _dump(folder: Path, name: str, dtype: torch.dtype, seq: int) -> Path:
    model = build_tiny_llama(CONFIG, dtype=dtype)
    path = folder / name
    with torch.no_grad(), capture(model, path, level="mix", mode="tensor"):
        model(example_input_ids(CONFIG, seq=seq))
    return path


def _shard_bytes(dump: Path) -> int:
    return sum(p.stat().st_size for p in dump.rglob("*.safetensors"))


def _numpy_read(dumps: list[Path]) -> None:
    for dump in dumps:
        for shard in dump.rglob("*.safetensors"):
            np.fromfile(shard, dtype=np.uint8).sum(dtype=np.uint64)


def native(args: argparse.Namespace) -> None:
    seq, repeat = (32, 1) if args.quick else (256, args.repeat)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        golden = _dump(folder, "golden", torch.float32, seq)
        same = _dump(folder, "same", torch.float32, seq)
        bf16 = _dump(folder, "bf16", torch.bfloat16, seq)
        print(f"model: {CONFIG.num_layers} layers, hidden {CONFIG.hidden_size}, seq {seq}")
        read = best_seconds(lambda: _numpy_read([golden, same]), repeat, warmup=True)
        size = _shard_bytes(golden) + _shard_bytes(same)
        print(f"numpy read of both dumps' shards: {size / read / 1e9:6.2f} GB/s  (baseline)")
        for name, target in (("identical target", same), ("bf16 target", bf16)):
            size = _shard_bytes(golden) + _shard_bytes(target)
            result = compare_dumps(golden, target)
            seconds = best_seconds(lambda t=target: compare_dumps(golden, t), repeat)
            speed = size / seconds / 1e9
            print(
                f"compare_dumps, {name:16}: {speed:6.2f} GB/s, {seconds:6.2f} s for "
                f"{len(result.records)} records ({size / 1e6:.0f} MB); "
                f"{size / read / 1e9 / speed:.1f}x slower than the read; "
                f"first divergence: {result.first_divergence and result.first_divergence.name}"
            )


@dataclass
class Run:
    """One command-line run: wall time, peak resident memory, the rows it wrote (one per
    record) and how many of them compared tensor data (msprobe: a cosine in the row)."""

    seconds: float
    peak_bytes: int
    rows: int
    compared: int


def _run(command: list[str], log: Path) -> tuple[float, int, int]:
    """Wall seconds, ``ru_maxrss`` in bytes (the largest process of the tree) and exit status."""
    with log.open("wb") as out:
        start = time.perf_counter()
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(process.pid, 0)
        seconds = time.perf_counter() - start
    process.returncode = os.waitstatus_to_exitcode(status)
    return seconds, usage.ru_maxrss * 1024, process.returncode


def _read_through(*dumps: Path) -> None:
    """Read every file once, so that each tool starts from the same page cache; a pair larger
    than the page cache could hold is left alone (both tools read it from disk)."""
    if _dump_bytes(*dumps) > _memory_bytes() // 2:
        return
    for dump in dumps:
        for file in dump.rglob("*"):
            if file.is_file():
                with file.open("rb") as f:
                    while f.read(1 << 24):
                        pass


def _dump_bytes(*dumps: Path) -> int:
    return sum(f.stat().st_size for d in dumps for f in d.rglob("*.pt"))


def _elements(numel: int) -> str:
    return f"{numel >> 20}M" if numel % (1 << 20) == 0 else str(numel)


def _memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _gelu_pair(work: Path, tensors: int, numel: int) -> tuple[Path, Path]:
    """The gelu pair of this size under ``work``, written unless already there, after
    checking that the disk holds it."""
    folder = work / f"gelu{tensors}" if numel == NUMEL else work / f"gelu{tensors}x{numel}"
    needed = pair_bytes(tensors, numel)
    have = _dump_bytes(folder) if folder.is_dir() else 0
    free = shutil.disk_usage(work).free
    if needed - have > free - (1 << 30):  # a GiB to spare for the tools' outputs
        raise SystemExit(
            f"{tensors} x {numel} float32 per side needs {needed / 1e9:.1f} GB in {work}, which "
            f"has {free / 1e9:.1f} GB free: give another folder with --keep DIR, or fewer "
            "--size / --tensors"
        )
    if have < needed:
        size = f"{tensors} x {_elements(numel)} float32 per side ({needed / 1e9:.1f} GB)"
        print(f"writing {size} in {folder}")
    return write_gelu_pair(folder, tensors, numel)


def _ours(golden: Path, target: Path, work: Path) -> Run:
    script = Path(sys.executable).with_name("pytest-precision")
    command = [str(script)] if script.is_file() else [sys.executable, "-m", "pytest_precision.cli"]
    log = work / "ours.log"
    seconds, peak, status = _run([*command, "compare", str(golden), str(target)], log)
    found = re.search(r"^records: (\d+) compared", log.read_text(), re.MULTILINE)
    if status > 1 or found is None:
        raise SystemExit(f"pytest-precision compare failed ({status}):\n{log.read_text()[-2000:]}")
    return Run(seconds, peak, int(found.group(1)), int(found.group(1)))


def _theirs(msprobe: Path, golden: Path, target: Path, work: Path) -> Run:
    out = work / "msprobe-out"
    shutil.rmtree(out, ignore_errors=True)
    command = [str(msprobe), "compare", "--target_path", str(target), "--golden_path", str(golden)]
    log = work / "msprobe.log"
    seconds, peak, status = _run([*command, "--output_path", str(out)], log)
    results = sorted(out.glob("compare_result_*.csv"))
    if status != 0 or len(results) != 1:
        raise SystemExit(f"msprobe compare failed ({status}):\n{log.read_text()[-2000:]}")
    with results[0].open(newline="") as f:
        rows = list(csv.DictReader(f))
    return Run(seconds, peak, len(rows), sum(_is_number(row["Cosine"]) for row in rows))


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _row(tool: str, run: Run, size: int, what: str) -> str:
    return (
        f"  {tool:<25} {run.seconds:7.2f} s  {size / run.seconds / 1e9:6.3f} GB/s  "
        f"peak RSS {run.peak_bytes / 2**20:5.0f} MiB  {what}"
    )


def _load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def side_by_side(
    name: str, golden: Path, target: Path, msprobe: Path | None, work: Path, repeat: int
) -> None:
    """Both tools on one pair, interleaved ``repeat`` times; the fastest run of each."""
    size = _dump_bytes(golden, target)
    print(f"{name}: {size / 1e9:.2f} GB of .pt files over both sides ({_load()})")
    ours: list[Run] = []
    theirs: list[Run] = []
    for _ in range(repeat):
        if msprobe is not None:
            _read_through(golden, target)
            theirs.append(_theirs(msprobe, golden, target, work))
        _read_through(golden, target)
        ours.append(_ours(golden, target, work))
    best = min(ours, key=lambda r: r.seconds)
    if msprobe is None:
        print(f"  {'msprobe compare':<25} SKIP: no msprobe (--msprobe PATH, or on PATH)")
    else:
        fastest = min(theirs, key=lambda r: r.seconds)
        rows = f"{fastest.rows} rows, {fastest.compared} with a cosine"
        print(_row("msprobe compare", fastest, size, rows))
    print(_row("pytest-precision compare", best, size, f"{best.rows} records compared"))
    if msprobe is not None:
        ratio = fastest.seconds / best.seconds
        memory = fastest.peak_bytes / best.peak_bytes
        print(f"  ratio: {ratio:.1f}x faster, {memory:.2f}x less peak memory ({_load()})")
        if fastest.rows != best.rows:
            print(f"  WARNING: msprobe wrote {fastest.rows} rows, we compared {best.rows} records")


def flatness(sizes: list[int], numel: int, work: Path, keep: bool) -> None:
    """Our side alone on pairs of growing size: peak memory must not grow with the dump.
    Each pair is deleted after its run unless ``keep``, so the disk holds one at a time."""
    for tensors in sizes:
        golden, target = _gelu_pair(work, tensors, numel)
        size = _dump_bytes(golden, target)
        _read_through(golden, target)
        run = _ours(golden, target, work)
        name = f"{tensors} x {_elements(numel)}"
        print(_row(name, run, size, f"{run.rows} records compared ({_load()})"), flush=True)
        if not keep:
            shutil.rmtree(golden.parent.parent)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--msprobe", type=Path, help="msprobe's launcher (default: on PATH)")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each tool; the fastest")
    parser.add_argument("--keep", type=Path, help="keep (and reuse) the dumps in this folder")
    parser.add_argument("--size", type=int, default=500, help="tensors per side of the pair")
    parser.add_argument("--numel", type=int, default=NUMEL, help="elements per tensor")
    parser.add_argument("--tensors", type=int, nargs="+", help="our peak memory at these sizes")
    parser.add_argument("--native", action="store_true", help="the native-dump benchmark")
    parser.add_argument("--quick", action="store_true", help="--native: a short sequence")
    args = parser.parse_args()
    if args.native:
        native(args)
        return
    found = args.msprobe or (Path(p) if (p := shutil.which("msprobe")) else None)
    with tempfile.TemporaryDirectory(prefix="compare-bench-") as tmp:
        work = args.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        print(f"machine: {os.cpu_count()} cores; {_load()}")
        tiny = write_gelu_pair(work / "gelu2", 2)  # start-up caches (numba's, .pyc) warmed
        _ours(*tiny, work)
        if args.tensors:
            flatness(args.tensors, args.numel, work, keep=args.keep is not None)
            return
        if found is not None:
            _theirs(found, *tiny, work)
        gelu = _gelu_pair(work, args.size, args.numel)
        name = f"{args.size} x {_elements(args.numel)} float32"
        side_by_side(name, *gelu, found, work, args.repeat)
        if found is None:
            print("HF Llama L1: SKIP: no msprobe to make the dump with")
            return
        pair = hf_llama_pair(work, found)
        if isinstance(pair, str):
            print(f"HF Llama L1: SKIP: {pair}")
            return
        side_by_side("HF Llama L1 tensor dump", *pair, found, work, args.repeat)


if __name__ == "__main__":
    main()
