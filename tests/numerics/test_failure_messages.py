"""What a failure report says about two patterns a user misreads: a uniform scale (a wrong
constant, not noise) and an ULP count at an expected zero (where one ULP is a subnormal)."""

from __future__ import annotations

import pytest
import torch

from pytest_precision import assert_close


def _message(actual: torch.Tensor, expected: torch.Tensor, **kwargs: object) -> str:
    with pytest.raises(AssertionError) as failure:
        assert_close(actual, expected, **kwargs)
    return str(failure.value)


@pytest.mark.parametrize("factor", [1.01, 0.5, -2.0])
def test_a_uniform_scale_is_named(factor: float) -> None:
    torch.manual_seed(0)
    golden = torch.randn(64, 64)
    message = _message(golden * factor, golden)
    assert f"every element is the expected one times {factor:.6g}: a uniform scale" in message


def test_noise_of_the_same_size_is_not_called_a_scale() -> None:
    torch.manual_seed(0)
    golden = torch.randn(64, 64)
    noisy = golden * (1 + 0.01 * torch.randn(64, 64))
    assert "uniform scale" not in _message(noisy, golden)


def test_a_scale_that_also_moves_a_zero_is_not_one() -> None:
    golden = torch.tensor([1.0, 2.0, 0.0, 4.0])
    assert "uniform scale" not in _message(torch.tensor([1.1, 2.2, 0.5, 4.4]), golden)


def test_max_ulp_at_an_expected_zero_says_where_it_comes_from() -> None:
    message = _message(torch.tensor([0.0, 1e-3, 0.0]), torch.zeros(3), standard="ulp")
    assert (
        "max ulp 7.13624e+41 (at an expected 0, where one ulp is the smallest subnormal" in message
    )


def test_max_ulp_elsewhere_has_no_note() -> None:
    message = _message(torch.tensor([1.0, 2.5]), torch.tensor([1.0, 2.0]), standard="ulp")
    assert "max ulp" in message
    assert "smallest subnormal" not in message
