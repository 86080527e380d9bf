"""Timing shared by the benchmark scripts."""

from __future__ import annotations

import time
from collections.abc import Callable


def best_seconds(run: Callable[[], object], repeat: int, *, warmup: bool = False) -> float:
    """The fastest of ``repeat`` runs: the least disturbed by other load on the machine."""
    if warmup:
        run()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)
