"""Fixtures shared by the tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import _pytest.pytester
import pytest

from pytest_precision.numerics import _chunks, _kernels, _stats_pass

#: name -> (kernels on?, (block, chunk, parallel threshold) or None for the defaults):
#: "kernels-tiny" makes small inputs cross blocks, chunks and threads (statistics share blocks
#: between threads from a quarter of the parallel threshold), so hypothesis-sized
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
            mp.setattr(_chunks, "CHUNK_NUMEL", chunk)
            mp.setattr(_kernels, "PARALLEL_NUMEL", parallel)
            mp.setattr(_stats_pass, "PARALLEL_STATS_NUMEL", parallel // 4)
        yield request.param


#: Packages whose modules must never be imported twice in one process: torch registers
#: operator libraries at import time and raises when such a module runs again.
IMPORT_ONCE = ("torch", "numpy", "numba", "llvmlite")


@pytest.fixture(scope="session", autouse=True)
def _in_process_runs_keep_import_once_modules() -> Iterator[None]:
    """An in-process pytester run deletes every module imported after its snapshot of
    sys.modules. torch imports some lazily (``torch.testing.assert_close`` pulls in
    ``torch.distributed.tensor``), and importing those a second time fails, so a test
    failed or passed depending on which test xdist ran first in its worker. pytester only
    lets us widen what its snapshots preserve by swapping the snapshot class."""
    original = _pytest.pytester.SysModulesSnapshot

    class KeepImportOnce(original):  # type: ignore[misc,valid-type]
        def __init__(self, preserve: Callable[[str], bool] | None = None) -> None:
            super().__init__(
                lambda name: (
                    name.partition(".")[0] in IMPORT_ONCE
                    or (preserve is not None and preserve(name))
                )
            )

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_pytest.pytester, "SysModulesSnapshot", KeepImportOnce)
        yield
