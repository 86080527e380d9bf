"""Fixtures shared by the metric tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pytest_precision import _kernels

#: name -> (kernels on?, (block, chunk, parallel threshold) or None for the defaults):
#: "kernels-tiny" makes small inputs cross blocks, chunks and threads, so hypothesis-sized
#: tensors reach every code path.
BACKENDS = {
    "torch": (False, None),
    "kernels": (True, None),
    "kernels-tiny": (True, (4, 16, 32)),
}


@pytest.fixture(scope="module", params=list(BACKENDS))
def metrics_backend(request: pytest.FixtureRequest) -> Iterator[str]:
    """Run a test once on the torch pipeline and twice on the numba kernels (default and
    tiny block / chunk / thread sizes); kernel runs skip visibly where numba is missing."""
    on, geometry = BACKENDS[request.param]
    if on and _kernels.describe().startswith("torch (install"):
        pytest.skip("numba is not installed (the fast extra)")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(_kernels.ENV_SWITCH, "1" if on else "0")
        if geometry is not None:
            block, chunk, parallel = geometry
            mp.setattr(_kernels, "BLOCK_NUMEL", block)
            mp.setattr(_kernels, "CHUNK_NUMEL", chunk)
            mp.setattr(_kernels, "PARALLEL_NUMEL", parallel)
        yield request.param
