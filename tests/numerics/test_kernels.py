"""The numba kernels compute what the torch pipeline computes, on every code path."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import threading
import weakref
from concurrent.futures import Future
from dataclasses import fields

import numpy as np
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from pytest_precision import compare_tensors, tensor_stats
from pytest_precision.numerics import _chunks, _kernels
from pytest_precision.numerics._measure import ElementRule, ErrorMetrics, Quantity, measure
from pytest_precision.numerics._standards import AllClose, Exact, Ratio, Ulp

needs_numba = pytest.mark.skipif(
    _kernels.describe().startswith("torch (install"), reason="numba is not installed"
)

#: (block, chunk, parallel threshold): small ones make small inputs cross every boundary.
GEOMETRIES = [(4096, 1 << 18, 1 << 21), (4, 16, 32), (3, 9, 10), (1, 5, 5)]
SUMS = {"cosine", "mean_abs_err", "mean_rel_err", "rmse", "sqnr_db", "mean_ulp", "expected_rms"}
#: Bounded metrics near 0 are judged absolutely (as in test_metrics).
ABSOLUTE = {"cosine": 1e-12, "sqnr_db": 1e-12}
DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
RULES = {
    "ratio": lambda dtype: Ratio().rule(dtype),
    "allclose": lambda dtype: AllClose().rule(dtype),
    "ulp": lambda dtype: Ulp().rule(dtype),
    "exact": lambda dtype: Exact().rule(dtype),
    "mixed": lambda dtype: ElementRule(
        (
            (Quantity.FLOORED_REL_ERR, 1e-3),
            (Quantity.REL_ERR, 1e-2),
            (Quantity.ABS_ERR, 0.5),
            (Quantity.ULP_ERR, 2.0),
        ),
        small_value=2.0**-9,
    ),
    "unfloored": lambda dtype: ElementRule(((Quantity.FLOORED_REL_ERR, 1e-3),)),
}


def _with_geometry(monkeypatch: pytest.MonkeyPatch, geometry: tuple[int, int, int]) -> None:
    block, chunk, parallel = geometry
    monkeypatch.setattr(_kernels, "BLOCK_NUMEL", block)
    monkeypatch.setattr(_chunks, "CHUNK_NUMEL", chunk)
    monkeypatch.setattr(_kernels, "PARALLEL_NUMEL", parallel)


def _both(
    monkeypatch: pytest.MonkeyPatch, run: object, geometry: tuple[int, int, int]
) -> tuple[object, object]:
    assert callable(run)
    with monkeypatch.context() as mp:
        mp.setenv(_kernels.ENV_SWITCH, "0")
        slow = run()
    with monkeypatch.context() as mp:
        mp.setenv(_kernels.ENV_SWITCH, "1")
        _with_geometry(mp, geometry)
        fast = run()
    return slow, fast


def assert_same_metrics(fast: ErrorMetrics, slow: ErrorMetrics) -> None:
    for f in fields(ErrorMetrics):
        ours, theirs = getattr(fast, f.name), getattr(slow, f.name)
        if f.name in SUMS and isinstance(theirs, float) and math.isfinite(theirs):
            assert ours == pytest.approx(theirs, rel=1e-12, abs=ABSOLUTE.get(f.name, 1e-300)), (
                f.name
            )
        elif isinstance(theirs, float) and math.isnan(theirs):
            assert math.isnan(ours), f.name
        else:
            assert ours == theirs, f.name


@st.composite
def messy_pairs(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor]:
    """Pairs of any two float dtypes, with zeros, tiny values, infinities and NaNs mixed in."""
    a_dtype, e_dtype = draw(st.sampled_from(DTYPES)), draw(st.sampled_from(DTYPES))
    n = draw(st.integers(0, 200))
    special = st.sampled_from([0.0, -0.0, 1e-30, math.inf, -math.inf, math.nan, 1.0, 3e-3])
    values = st.one_of(st.floats(-1e4, 1e4), special)
    expected = draw(hnp.arrays(np.float64, n, elements=values))
    if draw(st.booleans()):
        noise = draw(hnp.arrays(np.float64, n, elements=st.floats(-0.02, 0.02)))
        actual = expected * (1 + noise)
        spots = draw(hnp.arrays(np.bool_, n))
        actual = np.where(spots, draw(hnp.arrays(np.float64, n, elements=values)), actual)
    else:
        actual = draw(hnp.arrays(np.float64, n, elements=values))
    return torch.from_numpy(actual).to(a_dtype), torch.from_numpy(expected).to(e_dtype)


@needs_numba
@settings(max_examples=150, deadline=None)
@given(
    messy_pairs(),
    st.sampled_from(sorted(RULES)),
    st.sampled_from(GEOMETRIES),
)
def test_kernels_match_the_torch_pipeline(
    pair: tuple[torch.Tensor, torch.Tensor], rule_name: str, geometry: tuple[int, int, int]
) -> None:
    actual, expected = pair
    dtype = actual.dtype if actual.element_size() <= expected.element_size() else expected.dtype
    rule = RULES[rule_name](dtype)
    with pytest.MonkeyPatch.context() as mp:
        slow, fast = _both(mp, lambda: measure(actual, expected, rule), geometry)
    assert isinstance(slow, ErrorMetrics)
    assert isinstance(fast, ErrorMetrics)
    assert_same_metrics(fast, slow)


@needs_numba
@settings(max_examples=100, deadline=None)
@given(
    st.sampled_from(DTYPES),
    hnp.arrays(
        np.float64,
        st.integers(0, 200),
        elements=st.one_of(
            st.floats(-1e30, 1e30), st.sampled_from([math.inf, -math.inf, math.nan, -0.0])
        ),
    ),
    st.sampled_from(GEOMETRIES),
)
# Summed in another order, 1e30 + 1 + ... - 1e30 keeps some of the ones or none of them.
@example(torch.float64, np.array([1e30, *[1.0] * 100, -1e30]), GEOMETRIES[0])
def test_statistics_kernel_matches_the_torch_pipeline(
    dtype: torch.dtype, values: np.ndarray, geometry: tuple[int, int, int]
) -> None:
    t = torch.from_numpy(values).to(dtype)
    with pytest.MonkeyPatch.context() as mp:
        slow, fast = _both(mp, lambda: tensor_stats(t), geometry)
    magnitudes = t.double().abs()
    # A sum of mixed signs is exact only up to its order: the mean to 1e-12 of the mean
    # magnitude (the norm sums squares, of one sign, so it holds to 1e-12 of itself).
    mean_magnitude = float(magnitudes[magnitudes.isfinite()].mean()) if t.numel() else 0.0
    for name in ("max", "min", "mean", "norm", "nan_count", "posinf_count", "neginf_count"):
        ours, theirs = getattr(fast, name), getattr(slow, name)
        if isinstance(theirs, float) and math.isnan(theirs):
            assert math.isnan(ours), name
        elif name == "mean" and math.isfinite(theirs):
            assert ours == pytest.approx(theirs, rel=0, abs=1e-12 * mean_magnitude), name
        elif name == "norm" and math.isfinite(theirs):
            assert ours == pytest.approx(theirs, rel=1e-12, abs=1e-300), name
        else:
            assert ours == theirs, name
            assert math.copysign(1, ours) == math.copysign(1, theirs), f"{name}: sign of zero"


@needs_numba
@pytest.mark.parametrize("zeros", [[0.0, -0.0], [-0.0, 0.0], [-0.0, -0.0]])
def test_the_statistics_of_zeros_are_positive_zeros(zeros: list[float]) -> None:
    t = torch.tensor(zeros * 5000)
    with pytest.MonkeyPatch.context() as mp:
        for stats in _both(mp, lambda: tensor_stats(t), GEOMETRIES[0]):
            assert [math.copysign(1, stats.min), math.copysign(1, stats.max)] == [1, 1]


@needs_numba
def test_the_maximum_is_located_at_its_first_occurrence_across_threads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    expected = torch.ones(1000)
    actual = expected.clone()
    actual[[37, 501, 998]] = 3.0  # three equal maxima, in different chunks and threads
    _with_geometry(monkeypatch, (4, 16, 32))
    monkeypatch.setenv(_kernels.ENV_SWITCH, "1")
    m = measure(actual, expected)
    assert (m.max_abs_err, m.max_abs_index) == (2.0, (37,))
    assert (m.max_rel_err, m.max_rel_index) == (2.0, (37,))


@needs_numba
def test_non_finite_blocks_are_counted_and_left_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(_kernels.ENV_SWITCH, "1")
    expected = torch.tensor([1.0, math.nan, math.inf, 2.0, -math.inf, 0.0])
    actual = torch.tensor([1.0, math.nan, -math.inf, 2.5, -math.inf, math.nan])
    m = measure(actual, expected, Ratio().rule(torch.float32))
    assert (m.actual_nonfinite.nan, m.actual_nonfinite.neginf) == (2, 2)
    assert (m.expected_nonfinite.nan, m.expected_nonfinite.posinf) == (1, 1)
    assert m.nonfinite_mismatch_count == 2  # inf vs -inf, and NaN vs 0
    assert m.finite_count == 2
    assert (m.max_abs_err, m.max_abs_index) == (0.5, (3,))


@needs_numba
def test_concurrent_callers_get_their_own_results(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(_kernels.ENV_SWITCH, "1")
    _with_geometry(monkeypatch, (64, 256, 512))
    gen = torch.Generator().manual_seed(0)
    pairs = [(torch.randn(5000, generator=gen), torch.randn(5000, generator=gen)) for _ in range(8)]
    alone = [compare_tensors(a, e).max_abs_err for a, e in pairs]
    found: dict[int, float] = {}

    def run(i: int) -> None:
        for _ in range(5):
            found[i] = compare_tensors(*pairs[i]).max_abs_err

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(pairs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [found[i] for i in range(len(pairs))] == alone


@needs_numba
def test_the_thread_pool_widens_with_torch_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    # Every range must run at once: a pool built while torch had fewer threads would queue
    # some of them, and the barrier would break.
    _with_geometry(monkeypatch, (4, 16, 32))
    monkeypatch.setattr(_kernels, "_pool", None)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        _kernels.run_chunks(64, lambda lo, hi: hi - lo)
        torch.set_num_threads(4)
        together = threading.Barrier(4, timeout=10)
        assert _kernels.run_chunks(64, lambda lo, hi: together.wait() >= 0) == [True] * 4
    finally:
        torch.set_num_threads(threads)


@needs_numba
def test_the_caller_runs_the_ranges_no_pool_thread_has_started(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On a loaded machine a pool thread can start late: the calling thread takes the ranges
    left rather than wait for it, and the late thread's queued task holds nothing the work
    read (memory-mapped tensors would pile up). A pool that never runs anything stands in."""

    queued: list[object] = []

    class Stalled:
        def submit(self, *task: object) -> Future[None]:
            queued.append(task)
            return Future()  # never runs, never completes

    class Data:
        pass

    data = Data()
    alive = weakref.ref(data)

    def work(lo: int, hi: int, data: Data = data) -> tuple[int, int]:
        return lo, hi

    _with_geometry(monkeypatch, (4, 16, 32))
    monkeypatch.setattr(_kernels, "_threads", lambda width: Stalled())
    found: list[list[tuple[int, int]]] = []
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(4)
        caller = threading.Thread(
            target=lambda work=work: found.append(_kernels.run_chunks(64, work)),
            daemon=True,  # left behind, blocked, if the caller waits for the stalled pool
        )
        caller.start()
        caller.join(timeout=30)
    finally:
        torch.set_num_threads(threads)
    assert found == [[(0, 16), (16, 32), (32, 48), (48, 64)]]
    del data, work
    assert len(queued) == 3
    assert alive() is None


@needs_numba
def test_an_error_in_any_range_reaches_the_caller(monkeypatch: pytest.MonkeyPatch) -> None:
    def work(lo: int, hi: int) -> int:
        if lo == 32:
            raise ValueError(f"range {lo}:{hi}")
        return hi - lo

    _with_geometry(monkeypatch, (4, 16, 32))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(4)
        with pytest.raises(ValueError, match="range 32:48"):
            _kernels.run_chunks(64, work)
    finally:
        torch.set_num_threads(threads)


@needs_numba
def test_accepts_only_cpu_floats(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(_kernels.ENV_SWITCH, "1")
    assert _kernels.accepts(torch.zeros(2), torch.zeros(2, dtype=torch.bfloat16))
    assert not _kernels.accepts(torch.zeros(2, dtype=torch.int64))
    assert not _kernels.accepts(torch.zeros(2, device="meta"))
    monkeypatch.setenv(_kernels.ENV_SWITCH, "0")
    assert not _kernels.accepts(torch.zeros(2))
    assert _kernels.describe().startswith("torch (PYTEST_PRECISION_KERNELS=0")


@needs_numba
def test_the_switch_selects_the_implementation(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real = _kernels.compare

    def spy(*args: object, **kwargs: object) -> object:
        calls.append(1)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(_kernels, "compare", spy)
    # not identical: identical tensors need no pass at all
    monkeypatch.setenv(_kernels.ENV_SWITCH, "0")
    compare_tensors(torch.ones(3), torch.full((3,), 2.0))
    assert calls == []
    monkeypatch.setenv(_kernels.ENV_SWITCH, "1")
    compare_tensors(torch.ones(3), torch.full((3,), 2.0))
    assert calls == [1]


@needs_numba
def test_a_forked_child_rebuilds_the_thread_pool() -> None:
    # The parent starts the pool; a child forked afterwards has no worker threads and must
    # not wait on the inherited (dead) pool.
    script = """
import os, sys, torch
from pytest_precision import compare_tensors
from pytest_precision.numerics import _chunks, _kernels
_kernels.PARALLEL_NUMEL = 32
_chunks.CHUNK_NUMEL = 16
a = torch.arange(1000.0)
first = compare_tensors(a, a + 1).max_abs_err
pid = os.fork()
if pid == 0:
    os._exit(0 if compare_tensors(a, a + 1).max_abs_err == first else 1)
_, status = os.waitpid(pid, 0)
sys.exit(os.waitstatus_to_exitcode(status))
"""
    env = {**os.environ, _kernels.ENV_SWITCH: "1"}
    done = subprocess.run([sys.executable, "-c", script], env=env, timeout=120, check=False)
    assert done.returncode == 0


@needs_numba
def test_numba_with_its_jit_disabled_leaves_the_metrics_to_torch() -> None:
    # NUMBA_DISABLE_JIT (numba's debugging switch) would run the kernels as Python, where
    # their intrinsics cannot run at all.
    script = """
import torch
from pytest_precision import compare_tensors, tensor_stats
from pytest_precision.numerics import _kernels
assert compare_tensors(torch.ones(3), torch.ones(3) + 0.1).verdict == "fail"
assert tensor_stats(torch.ones(3)).mean == 1.0
print(_kernels.describe())
"""
    env = {**os.environ, _kernels.ENV_SWITCH: "1", "NUMBA_DISABLE_JIT": "1"}
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, timeout=120, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("torch (NUMBA_DISABLE_JIT=1; numba ")


@needs_numba
def test_limits_are_exclusive(monkeypatch: pytest.MonkeyPatch) -> None:
    at_limit = ElementRule(((Quantity.REL_ERR, 2.0**-7), (Quantity.ALLCLOSE_EXCESS, 0.0)))
    one = torch.ones(1, dtype=torch.float64)
    for switch in ("0", "1"):
        monkeypatch.setenv(_kernels.ENV_SWITCH, switch)
        assert measure(one + 2.0**-7, one, at_limit).rule_counts == (0, 1), switch


@needs_numba
def test_a_small_value_without_exact_inverse_takes_the_torch_pipeline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # d * (1 / small) rounds this d one ulp above d / small: only a true division counts it
    # right, so the kernels (which multiply) must not take such a rule.
    d, small = 0.0008444177601983557, 1e-3
    assert d * (1 / small) > d / small
    floored = ElementRule(((Quantity.FLOORED_REL_ERR, d / small),), small_value=small)
    monkeypatch.setenv(_kernels.ENV_SWITCH, "1")
    monkeypatch.setattr(_kernels, "compare", None)  # would raise if it were called
    zero = torch.zeros(1, dtype=torch.float64)
    assert measure(zero + d, zero, floored).rule_counts == (0,)
    assert not _kernels.fits(1, small)
    assert _kernels.fits(4, 2.0**-10)
    assert _kernels.fits(1, 0.0)
    assert not _kernels.fits(5, 0.0)


@needs_numba
@pytest.mark.parametrize("small", [2.0**-1024, 2.0**-1074])
def test_a_small_value_whose_inverse_overflows_is_divided_by(
    monkeypatch: pytest.MonkeyPatch, small: float
) -> None:
    # 1 / small is inf: multiplying by it would read the floored error of d = small as inf.
    floored = ElementRule(((Quantity.FLOORED_REL_ERR, 2.0),), small_value=small)
    zero = torch.zeros(1, dtype=torch.float64)
    monkeypatch.setenv(_kernels.ENV_SWITCH, "1")
    assert measure(zero + small, zero, floored).rule_counts == (0,)
    assert not _kernels.fits(1, small)
    assert _kernels.fits(1, 2.0**-1023)


def test_without_numba_the_torch_pipeline_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_kernels, "_numba_version", lambda: None)
    monkeypatch.setattr(_kernels, "compare", None)  # would raise if it were called
    assert not _kernels.enabled()
    assert "install pytest-precision[fast]" in _kernels.describe()
    assert compare_tensors(torch.ones(3), torch.ones(3) + 1e-9).verdict == "pass"


@needs_numba
def test_a_block_without_finite_pairs_holds_no_maximum(monkeypatch: pytest.MonkeyPatch) -> None:
    # The first block is all NaN (equal on both sides), the second all equal: the maximum
    # error 0 is at the first finite element, not in the NaN block that reads as zeros.
    _with_geometry(monkeypatch, (4, 16, 1 << 30))
    values = torch.tensor([math.nan] * 4 + [1.0, 2.0, 3.0, 4.0])
    for switch in ("0", "1"):
        monkeypatch.setenv(_kernels.ENV_SWITCH, switch)
        m = measure(values, values.clone())
        assert (m.max_abs_err, m.max_abs_index, m.max_rel_index) == (0.0, (4,), (4,)), switch
        stats = tensor_stats(values)
        assert (stats.min, stats.max, stats.nan_count) == (1.0, 4.0, 4), switch
