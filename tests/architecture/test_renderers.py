"""Results are data: they carry no rendering methods, and ``pytest_precision.render`` takes any
of them."""

from __future__ import annotations

import pytest

import pytest_precision
from pytest_precision import PrecisionInputError, render


@pytest.mark.parametrize("name", ["DumpComparison", "ReplayResult", "TokenComparison"])
def test_a_result_has_no_rendering_method(name: str) -> None:
    result = getattr(pytest_precision, name)
    assert not {"report", "write_json", "write_csv"} & set(vars(result))


def test_render_takes_an_output_result_and_refuses_anything_else() -> None:
    tokens = pytest_precision.compare_tokens([1, 2, 3], [1, 2, 4])
    assert "2" in render(tokens)
    with pytest.raises(PrecisionInputError, match="no text form for a object"):
        render(object())
