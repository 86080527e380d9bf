"""Capture overhead: forward time with capture against the same forward without it.

Baselines: a plain forward (no capture) of a ~100M-parameter Llama-style decoder (fp32, seq 256),
and a plain sequential write of the same number of bytes for the write speed. msprobe measured
1.8x (statistics) and 15x (tensor) on a comparable model. Targets: statistics at op level <= 1.2x,
tensor mode <= 3x, and peak extra memory under 300 MB while a forward produces 2 GB of tensors.

    python benchmarks/capture_overhead.py [--repeat 3] [--quick]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _timing import best_seconds

from examples.tiny_llama import TinyLlamaConfig, build_tiny_llama, example_input_ids
from pytest_precision import capture, tensor_stats
from pytest_precision.dump._writer import DumpWriter
from pytest_precision.numerics import _kernels

CONFIG_100M = TinyLlamaConfig(
    vocab_size=16000,
    hidden_size=768,
    intermediate_size=2048,
    num_layers=10,
    num_heads=12,
    num_kv_heads=12,
)
QUICK = CONFIG_100M.with_(num_layers=2, vocab_size=4000)


def _folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _plain_write_seconds(nbytes: int, folder: Path) -> float:
    """Sequential write of ``nbytes`` in 32 MiB blocks: the disk's speed for these bytes."""
    block = os.urandom(1 << 20) * 32
    target = folder / "plain.bin"
    start = time.perf_counter()
    with target.open("wb") as handle:
        left = nbytes
        while left > 0:
            handle.write(block[: min(left, len(block))])
            left -= len(block)
    elapsed = time.perf_counter() - start
    target.unlink()
    return elapsed


def overhead(config: TinyLlamaConfig, repeat: int, seq: int) -> None:
    model = build_tiny_llama(config, seed=0)
    params = sum(p.numel() for p in model.parameters())
    ids = example_input_ids(config, seq=seq)
    threads = torch.get_num_threads()
    print(f"model: {params / 1e6:.0f}M parameters, fp32, seq {seq}, {threads} threads")
    print("ratio = forward with capture / forward without (fastest of interleaved runs)")
    work = Path(tempfile.mkdtemp(prefix="capture-bench-"))
    with torch.no_grad():
        model(ids)  # warm-up
        try:
            for level in ("op", "mix", "module"):
                for mode in ("statistics", "tensor"):
                    sizes: list[int] = []

                    def plain() -> None:
                        model(ids)

                    def captured(level: str = level, mode: str = mode) -> None:
                        with capture(model, work / "run", level=level, mode=mode):  # type: ignore[arg-type]
                            model(ids)

                    def remove(sizes: list[int] = sizes) -> None:
                        # Deleted before the next run: dirty pages of an old dump would make the
                        # next one wait for the disk instead of the page cache.
                        sizes.append(_folder_bytes(work / "run"))
                        shutil.rmtree(work / "run")

                    base, seconds = _interleaved(plain, captured, repeat, after=remove)
                    step = _decode_step_seconds(model, ids, work / "steps", level, mode, repeat)
                    shutil.rmtree(work / "steps")
                    base = min(base, best_seconds(plain, repeat))
                    print(
                        f"{mode:>10} / {level:<6}: one forward {seconds / base:.2f}x, "
                        f"per decode step {step / base:.2f}x "
                        f"(no capture {base:.3f} s; {sizes[-1] / 2**20:.0f} MiB written)",
                        flush=True,
                    )
            write_speed(work, 512 << 20)
        finally:
            shutil.rmtree(work, ignore_errors=True)


def _interleaved(
    first: Callable[[], object],
    second: Callable[[], object],
    repeat: int,
    after: Callable[[], object] = lambda: None,
) -> tuple[float, float]:
    """Best times of ``first`` and ``second`` run alternately, so both see the same load;
    ``after`` runs untimed after each ``second``."""
    a, b = [], []
    for _ in range(repeat):
        a.append(best_seconds(first, 1))
        b.append(best_seconds(second, 1))
        after()
    return min(a), min(b)


def write_speed(work: Path, nbytes: int) -> None:
    """The dump writer (statistics included) against a plain write of the same bytes."""
    tensors = [torch.randn(1 << 18) for _ in range(nbytes // (1 << 20))]  # 1 MiB each
    entry = {"name": "Torch.op.0.forward", "kind": "Torch", "op": "op", "step": 0}

    def dump() -> None:
        writer = DumpWriter(work / "writer", rank=0, world_size=1, info={})
        writer.start()
        for key, t in enumerate(tensors):
            writer.add(dict(entry, slot=f"output.{key}"), key=str(key), tensor=t.clone())
        writer.close()

    plain, dumped = _interleaved(
        lambda: _plain_write_seconds(nbytes, work),
        dump,
        3,
        after=lambda: shutil.rmtree(work / "writer"),
    )
    print(
        f"write speed: dump writer {nbytes / dumped / 2**20:.0f} MiB/s (with statistics) vs "
        f"plain sequential write {nbytes / plain / 2**20:.0f} MiB/s: {plain / dumped:.0%}"
    )


def _decode_step_seconds(
    model: torch.nn.Module, ids: torch.Tensor, folder: Path, level: str, mode: str, repeat: int
) -> float:
    """Steady state of a decode loop: later forwards of one capture (weights already stored)."""
    with capture(model, folder, level=level, mode=mode) as cap:  # type: ignore[arg-type]
        model(ids)

        def next_step() -> None:
            cap.step()
            model(ids)

        seconds = best_seconds(next_step, repeat)
    return seconds


class _Producer(torch.nn.Module):
    """Each layer makes a new 32 MiB tensor: 64 layers produce 2 GiB at op level."""

    def __init__(self, layers: int) -> None:
        super().__init__()
        self.layers = layers

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(self.layers):
            x = x * 1.0001
        return x


def _peak_rss() -> int:
    """Peak resident memory of this process (``VmHWM``: unlike ru_maxrss, not inherited)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _memory_child(kind: str, layers: int) -> None:
    model = _Producer(layers)
    x = torch.ones(8 << 20)  # 32 MiB
    if kind != "bare":  # the metrics kernels' runtime (numba, LLVM) is loaded once per process
        tensor_stats(torch.ones(16))
    with torch.no_grad():
        if kind == "capture":
            folder = Path(tempfile.mkdtemp(prefix="capture-mem-"))
            try:
                with capture(model, folder / "dump", level="op", mode="tensor") as _:
                    model(x)
                size = _folder_bytes(folder / "dump")
            finally:
                shutil.rmtree(folder, ignore_errors=True)
        else:
            model(x)
            size = 0
    print(f"{_peak_rss()} {size}")


def memory(layers: int) -> None:
    def child(kind: str) -> tuple[int, int]:
        out = subprocess.run(
            [sys.executable, __file__, "--memory-child", kind, "--layers", str(layers)],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.split()
        return int(out[0]), int(out[1])

    bare_peak, _ = child("bare")
    base_peak, _ = child("none")
    peak, size = child("capture")
    extra = (peak - base_peak) / 2**20
    print(
        f"memory: forward producing {size / 2**30:.2f} GiB captured in tensor mode; "
        f"peak RSS {peak / 2**20:.0f} MiB vs {base_peak / 2**20:.0f} MiB without capture: "
        f"{extra:.0f} MiB extra (target < 300 MB); the metrics kernels' runtime "
        f"({_kernels.describe()}) costs {(base_peak - bare_peak) / 2**20:.0f} MiB once per process"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="a 2-layer model, for a smoke run")
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--layers", type=int, default=64, help="memory check: 32 MiB per layer")
    parser.add_argument(
        "--memory-child", choices=["bare", "none", "capture"], help=argparse.SUPPRESS
    )
    parser.add_argument("--skip-memory", action="store_true")
    args = parser.parse_args()
    if args.memory_child:
        _memory_child(args.memory_child, args.layers)
        return
    overhead(QUICK if args.quick else CONFIG_100M, args.repeat, args.seq)
    if not args.skip_memory:
        memory(4 if args.quick else args.layers)


if __name__ == "__main__":
    main()
