"""The terminal renderers of output-level results."""

from __future__ import annotations

import torch

from pytest_precision import (
    check_scores,
    check_weights_loaded,
    compare_tokens,
    detect_symptoms,
    diff_configs,
    pick_badcases,
)
from pytest_precision.report._output import (
    badcases_text,
    diff_text,
    scores_text,
    symptoms_text,
    tokens_text,
    weights_text,
)


def test_each_result_renders() -> None:
    tokens = tokens_text(compare_tokens([[1, 2, 3], [4, 5]], [[1, 2, 3], [4, 6]]))
    assert tokens.splitlines()[0].startswith("tokens: 1 of 2 row(s) agree")
    assert "DIVERGED  row 1: tokens diverge at position 1" in tokens

    assert symptoms_text([]) == "no symptoms in the output"
    loop = symptoms_text(detect_symptoms([9, 8] + [1, 2, 3] * 6))
    assert "repetition at token 2: loop at the tail" in loop

    assert "FAIL" in scores_text(check_scores(0.69, 0.702))

    net = torch.nn.Linear(2, 2)
    report = weights_text(check_weights_loaded(net, {"weight": net.weight.detach().clone()}))
    assert report.startswith("PROBLEMS: weights of state dict: 1 loaded")
    assert "parameters not loaded in the network (no weight for them) (1):\n  bias" in report

    diff = diff_text(diff_configs({"eos_token_id": 2, "hidden_size": 4}, {"eos_token_id": 3}))
    assert diff.splitlines()[1:] == [
        "  special tokens and padding:",
        "    eos_token_id  2 -> 3",
        "  structure:",
        "    hidden_size   4 -> None",
    ]
    assert diff_text(diff_configs({}, {})) == "no config differences"

    cases = badcases_text(pick_badcases([{"id": 1, "answer": "a"}], [{"id": 1, "answer": "b"}]))
    assert "1. 1: answers differ from word 0: 'a' vs 'b'" in cases
    assert cases.endswith("localize case 1 first")
