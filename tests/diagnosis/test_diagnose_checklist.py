"""The weights checklist between two live models reads an unchanged parameter once (a bitwise
comparison) instead of computing its float64 fingerprint on both sides, and finds the same
changes as fingerprinting everything."""

from __future__ import annotations

import pytest
import torch
from planted import build, twin

from pytest_precision.diagnosis import _workflow
from pytest_precision.diagnosis._sides import Side, fingerprints
from pytest_precision.output import _weights


def test_only_parameters_that_differ_are_fingerprinted(monkeypatch: pytest.MonkeyPatch) -> None:
    golden = build("llama")
    target = twin(golden)
    with torch.no_grad():
        target.model.layers[1].self_attn.o_proj.weight.mul_(1.0 + 1e-3)
        target.lm_head.weight[3, 5] = float("nan")
    g, t = Side("golden", golden), Side("target", target)
    full = _workflow._weight_changes(g.fingerprint(), t.fingerprint(), 1e-3)

    fingerprinted: list[int] = []
    stats = _weights._stats
    monkeypatch.setattr(_weights, "_stats", lambda p: fingerprinted.append(1) or stats(p))
    g_print, t_print = fingerprints(g, t)
    changed = ["lm_head.weight", "model.layers.1.self_attn.o_proj.weight"]
    assert sorted(g_print) == sorted(t_print) == changed
    assert len(fingerprinted) == 2 * len(changed)
    found = _workflow._weight_changes(g_print, t_print, 1e-3)
    assert [(w.name, w.statistic) for w in found] == [(w.name, w.statistic) for w in full]
    assert [w.name for w in full] == changed  # the NaN in lm_head is a change of its own


def test_a_parameter_of_another_dtype_is_fingerprinted_on_both_sides() -> None:
    golden = build("llama")
    target = twin(golden).to(torch.bfloat16)
    g_print, t_print = fingerprints(Side("golden", golden), Side("target", target))
    assert sorted(g_print) == sorted(t_print) == sorted(n for n, _ in golden.named_parameters())


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_a_parameter_holding_a_non_finite_value_is_a_change(value: float) -> None:
    golden = build("llama")
    target = twin(golden)
    with torch.no_grad():
        target.model.layers[0].mlp.up_proj.weight[2, 7] = value
    changes = _workflow._weight_changes(
        *fingerprints(Side("golden", golden), Side("target", target)), 1e-3
    )
    assert [(w.name, w.statistic) for w in changes] == [
        ("model.layers.0.mlp.up_proj.weight", "mean")
    ]


def test_non_finite_statistics_equal_on_both_sides_are_no_change() -> None:
    golden = build("llama")
    with torch.no_grad():
        golden.lm_head.weight[0, 0] = float("nan")
    changes = _workflow._weight_changes(
        Side("golden", golden).fingerprint(), Side("target", twin(golden)).fingerprint(), 1e-3
    )
    assert changes == ()
