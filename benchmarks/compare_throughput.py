"""Throughput of the comparison metrics against named baselines.

Compares two 256 MB float32 tensors and prints GB/s of input read for:
  * pytest_precision.compare_tensors (all float64 metrics + the default standard),
  * torch.testing.assert_close (the baseline users know),
  * a plain numpy sum over both tensors (the memory-read ceiling),
plus the peak extra resident memory of our metrics pass.

Our metrics run on the numba kernels where numba is installed (the ``fast`` extra); the torch
pipeline (``PYTEST_PRECISION_KERNELS=0``, also what runs without numba) is timed too. The
one-time JIT compilation (or cache load) happens before the timing and the memory watch.

Two pairs are timed for us: a "close" pair (relative noise 1e-7, every chunk provably within
the standard from its relative error alone, so the standard's elementwise rule is skipped) and
a "noisy" pair (absolute noise, so near-zero expected values have large relative errors and the
rule runs on every chunk). torch.testing gets the close pair (it raises on the noisy one).

    python benchmarks/compare_throughput.py [--mb 256] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch
from _timing import best_seconds

from pytest_precision import compare_tensors
from pytest_precision.numerics import _kernels


def _rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise OSError("no VmRSS")


class PeakRss:
    """Polls the resident set size in a thread; ``extra`` is the peak above the start."""

    def __enter__(self) -> PeakRss:
        self.start = self.peak = _rss_bytes()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()
        return self

    def _poll(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, _rss_bytes())
            time.sleep(0.0005)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss_bytes())

    @property
    def extra(self) -> int:
        return self.peak - self.start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=256, help="size of each tensor in MB")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    n = args.mb * 2**20 // 4
    gen = torch.Generator().manual_seed(0)
    expected = torch.randn(n, generator=gen)
    actual = expected.clone()
    actual.mul_(1 + 1e-7)
    noisy = expected + 1e-6 * torch.randn(n, generator=gen)
    read_gb = 2 * n * 4 / 1e9

    def timed(run: Callable[[], object]) -> float:
        return best_seconds(run, args.repeat, warmup=True)

    compare_tensors(actual[:100_000], expected[:100_000])  # JIT compilation or cache load
    with PeakRss() as rss:
        ours = timed(lambda: compare_tensors(actual, expected))
        ours_noisy = timed(lambda: compare_tensors(noisy, expected))
    os.environ[_kernels.ENV_SWITCH] = "0"
    torch_pipeline = timed(lambda: compare_tensors(actual, expected))
    del os.environ[_kernels.ENV_SWITCH]
    theirs = best_seconds(
        lambda: torch.testing.assert_close(actual, expected), args.repeat, warmup=True
    )
    a_np, e_np = actual.numpy(), expected.numpy()
    read = timed(lambda: (a_np.sum(), e_np.sum()))

    ours_gbs, theirs_gbs, read_gbs = read_gb / ours, read_gb / theirs, read_gb / read
    print(f"inputs: 2 x {args.mb} MB float32, {torch.get_num_threads()} torch threads")
    print(f"metrics implementation: {_kernels.describe()}")
    print(f"pytest_precision.compare_tensors  {ours_gbs:7.2f} GB/s  (close pair)")
    print(f"pytest_precision.compare_tensors  {read_gb / ours_noisy:7.2f} GB/s  (noisy pair)")
    print(f"  torch pipeline, for reference   {read_gb / torch_pipeline:7.2f} GB/s  (close pair)")
    print(f"torch.testing.assert_close        {theirs_gbs:7.2f} GB/s")
    print(f"numpy sum over both (read)        {read_gbs:7.2f} GB/s")
    print(f"ratio vs torch.testing: {ours_gbs / theirs_gbs:.1f}x faster")
    print(
        f"ratio vs plain read:    {ours_gbs / read_gbs:.2f}x its speed (numpy sums on one thread)"
    )
    print(f"peak extra memory of the metrics pass: {rss.extra / 2**20:.1f} MB")


if __name__ == "__main__":
    main()
