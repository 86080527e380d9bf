"""pytest_precision.strategies: dtypes (bf16 included), shapes, ranges, special values, the
perturbation of a recorded call's inputs, and a clear error without hypothesis."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("hypothesis")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from pytest_precision import PrecisionInputError, capture  # noqa: E402
from pytest_precision import strategies as pst  # noqa: E402

FAST = settings(max_examples=25, deadline=None)


def test_every_float_dtype_is_drawn() -> None:
    assert {torch.float16, torch.bfloat16, torch.float32, torch.float64} <= set(pst.FLOAT_DTYPES)
    seen: set[torch.dtype] = set()

    @FAST
    @given(pst.float_dtypes())
    def collect(dtype: torch.dtype) -> None:
        seen.add(dtype)

    collect()
    assert torch.bfloat16 in seen


@FAST
@given(pst.tensors(dtype=torch.bfloat16, shape=pst.shapes(max_dims=3), min_value=-2, max_value=3))
def test_values_stay_in_range_and_dtype(x: torch.Tensor) -> None:
    assert x.dtype == torch.bfloat16
    assert x.dim() <= 3
    if x.numel():
        assert float(x.min()) >= -2
        assert float(x.max()) <= 3


@FAST
@given(pst.tensors(dtype=torch.float16, shape=(64,), special=["nan", "inf"]))
def test_special_values_on_demand(x: torch.Tensor) -> None:
    # only the special values asked for: NaN and +inf, never -inf
    assert all(math.isfinite(v) or math.isnan(v) or v == math.inf for v in x.double().tolist())


def test_special_values_do_appear() -> None:
    found: list[bool] = []

    @settings(max_examples=60, deadline=None)
    @given(pst.tensors(dtype=torch.float32, shape=(16,), special=True))
    def probe(x: torch.Tensor) -> None:
        found.append(bool(torch.isnan(x).any()))

    probe()
    assert any(found)


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(PrecisionInputError, match="unknown special"):
        pst.tensors(special=["huge"])
    with pytest.raises(PrecisionInputError, match="above max_value"):
        pst.tensors(min_value=1, max_value=0)


def test_perturbed_inputs_stay_within_the_recorded_range(tmp_path: Path) -> None:
    x = torch.randn(4, 8)
    lin = torch.nn.Linear(8, 3)
    with torch.no_grad(), capture(lin, tmp_path / "d", level="op"):
        lin(x)

    @FAST
    @given(pst.perturbed_inputs(tmp_path / "d", "Functional.linear.0.forward", scale=0.05))
    def fuzz(inputs: dict[str, torch.Tensor]) -> None:
        moved = inputs["input.0"]
        assert moved.shape == x.shape
        assert moved.dtype == x.dtype
        assert float(moved.min()) >= float(x.min())
        assert float(moved.max()) <= float(x.max())
        assert float((moved - x).abs().max()) <= 0.05 * float(x.max() - x.min()) + 1e-6
        torch.nn.functional.linear(moved, inputs["input.1"], inputs.get("input.2"))

    fuzz()


def test_import_without_hypothesis_says_what_to_install() -> None:
    code = (
        "import sys; sys.modules['hypothesis'] = None; sys.modules['hypothesis.strategies'] = None\n"  # noqa: E501
        "import pytest_precision.strategies"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 1
    assert "pytest_precision.strategies needs hypothesis: pip install hypothesis" in done.stderr


def test_shapes_are_bounded() -> None:
    @FAST
    @given(pst.shapes(min_dims=1, max_dims=2, min_side=1, max_side=3))
    def check(shape: tuple[int, ...]) -> None:
        assert 1 <= len(shape) <= 2
        assert all(1 <= s <= 3 for s in shape)

    check()
    assert isinstance(pst.shapes(), st.SearchStrategy)
