"""Dump comparison speed: compare_dumps on two tensor dumps of a Llama-style decoder.

Baseline: reading the same safetensors shards with numpy and summing them (the memory and disk
read speed, the floor of any comparison that reads every byte). msprobe's compare measured about
0.1 GB/s. Two cases: an identical target (every record compared, nothing to rerun) and a
bfloat16 target (every op drifts, so each is rerun in float64 from its recorded inputs to clear
it: the price of telling noise from a bug).

    python benchmarks/compare_dumps.py [--repeat 3] [--quick]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="a shorter sequence, one repeat")
    args = parser.parse_args()
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


if __name__ == "__main__":
    main()
