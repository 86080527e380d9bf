"""Rules 10 and 11 of ``docs/compare.md`` on the smallest statistics dumps that show them, built
record by record without module records (msprobe's L1): code only one run has judged by the
input it feeds, and a weight of a lower-precision run held to one rounding of the golden's.
The real msprobe dumps of ``test_msprobe_archs.py`` check both on six architectures."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from test_localize_rules import Dumps

from pytest_precision import Dump, compare_dumps
from pytest_precision.report import render

H = torch.linspace(-3.0, 3.0, 256).reshape(4, 64)
W = torch.randn(32, 64, generator=torch.Generator().manual_seed(0)) * 0.1


def _tanh_formula(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def _activation(gelu: str) -> Dump:
    """An up projection's output, an activation, the down projection of what it put out.
    ``formula``: the golden's tanh GELU as one recorded op; else ``F.gelu`` in its place."""
    d = Dumps(statistics=True)
    d.call("Functional.linear.0.forward", None, {"input.0": H, "output.0": H})
    if gelu == "formula":
        y = _tanh_formula(H)
        d.call("Torch.tanh.0.forward", None, {"input.0": H, "output.0": y})
    else:
        y = F.gelu(H, approximate=gelu)
        d.call("Functional.gelu.0.forward", None, {"input.0": H, "output.0": y})
    slots = {"input.0": y, "input.1": W, "output.0": y @ W.T}
    d.call("Functional.linear.1.forward", None, slots)
    return d.dump()


def test_code_only_the_target_runs_is_judged_by_the_input_it_feeds() -> None:
    """An exact GELU where the golden computes the tanh formula: it read exactly the golden's
    values, and the down projection's input differs beyond reordered rounding."""
    result = compare_dumps(_activation("formula"), _activation("none"))
    d = result.first_divergence
    assert d is not None, render(result)
    assert d.rule == "code only one run has", render(result)
    assert d.name == "Functional.linear.1.forward", render(result)
    assert "Functional.gelu.0.forward read exactly the golden's values" in d.reason


def test_an_equivalent_rewrite_is_no_culprit() -> None:
    """The same tanh GELU as ``F.gelu(approximate="tanh")``: a few ULPs apart."""
    result = compare_dumps(_activation("formula"), _activation("tanh"))
    assert result.first_divergence is None, render(result)


def _linear(dtype: torch.dtype, wrong: float = 0.0) -> Dump:
    """One ``linear`` whose weight (its ``input.1``, from no recorded call) is ``W`` cast to
    ``dtype``, one element ``wrong`` off."""
    weight = W.clone()
    weight[0, 0] += wrong
    x, w = H.to(dtype), weight.to(dtype)
    d = Dumps(statistics=True)
    d.call("Functional.linear.0.forward", None, {"input.0": x, "input.1": w, "output.0": x @ w.T})
    return d.dump()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_weight_cast_once_is_no_source(dtype: torch.dtype) -> None:
    result = compare_dumps(_linear(torch.float32), _linear(dtype))
    assert result.first_divergence is None, render(result)


def test_a_wrong_weight_element_below_bf16_tolerance_is_a_source() -> None:
    """+0.5 on one of 2048 elements: within the standard's bf16 tolerance, not a cast."""
    result = compare_dumps(_linear(torch.float32), _linear(torch.bfloat16, wrong=0.5))
    d = result.first_divergence
    assert d is not None, render(result)
    assert d.rule == "source", render(result)
    assert d.record.slot == "input.1", render(result)
    assert "no rounding of the golden's float32" in d.reason, d.reason
