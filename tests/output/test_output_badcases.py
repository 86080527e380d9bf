"""Bad-case picking from two evaluation runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_precision import PrecisionInputError, assert_no_badcases, pick_badcases
from pytest_precision.output._badcases import BadCasesFound

GOLDEN = [
    {"id": "a", "prompt": "1+1?", "answer": "The answer is 2.", "score": 1.0},
    {"id": "b", "prompt": "Capital of France?", "answer": "Paris is the capital.", "score": 1.0},
    {"id": "c", "prompt": "Say hi", "answer": "Hi there!", "score": 1.0},
    {"id": "d", "prompt": "2+2?", "answer": "It is 4.", "score": 1.0},
    {"id": "e", "prompt": "颜色?", "answer": "天空是蓝色的。", "score": 1.0},
    {"id": "g", "prompt": "only golden", "answer": "x", "score": 1.0},
]
TARGET = [
    {"id": "a", "prompt": "1+1?", "answer": "The answer is 2.", "score": 1.0},  # same
    {"id": "b", "prompt": "Capital of France?", "answer": "Lyon is the capital.", "score": 0.0},
    {"id": "c", "prompt": "Say hi", "answer": "Hi there, friend!", "score": 1.0},
    {"id": "d", "prompt": "2+2?", "answer": "It is 5.", "score": 0.0},
    {"id": "e", "prompt": "颜色?", "answer": "天空是红色的。", "score": 1.0},
    {"id": "t", "prompt": "only target", "answer": "y", "score": 1.0},
]


def test_cases_are_ranked_first_token_and_score_loss_first() -> None:
    result = pick_badcases(GOLDEN, TARGET)
    assert [c.key for c in result.cases] == ["b", "d", "c", "e"]
    first = result.cases[0]
    assert first.first_token
    assert first.score_loss == 1.0
    assert (first.position, first.golden_token, first.target_token) == (0, "Paris", "Lyon")
    assert result.cases[1].position == 2  # "It is 4" vs "It is 5": a score loss, later
    assert result.cases[3].position == 3
    assert result.cases[3].golden_token == "蓝"
    assert result.matched == 5
    assert result.matched_by == "id"
    assert result.only_golden == ("g",)
    assert result.only_target == ("t",)
    assert [c.key for c in pick_badcases(GOLDEN, TARGET, limit=1).cases] == ["b"]


def test_ids_are_compared_token_by_token_and_prompts_match_without_ids() -> None:
    golden = [{"prompt": "p1", "ids": [1, 2, 3]}, {"prompt": "p2", "ids": [4, 5]}]
    target = [{"prompt": "p2", "ids": [4, 6]}, {"prompt": "p1", "ids": [1, 2, 3]}]
    result = pick_badcases(golden, target)
    assert result.matched_by == "prompt"
    (case,) = result.cases
    assert (case.key, case.position, case.golden_token, case.target_token) == ("p2", 1, 5, 6)
    assert "token 1" in case.reason


def test_files_jsonl_and_json(tmp_path: Path) -> None:
    a, b = tmp_path / "a.jsonl", tmp_path / "b.json"
    a.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in GOLDEN) + "\n", "utf-8")
    b.write_text(json.dumps({"results": TARGET}, ensure_ascii=False), "utf-8")
    assert [c.key for c in pick_badcases(a, b).cases] == ["b", "d", "c", "e"]
    with pytest.raises(BadCasesFound, match="4 of 5 matched case"):
        assert_no_badcases(a, b)
    assert_no_badcases(a, a)


def test_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(PrecisionInputError, match="appears twice"):
        pick_badcases([{"id": 1, "score": 1}, {"id": 1, "score": 0}], [])
    with pytest.raises(PrecisionInputError, match="no answer, ids or score"):
        pick_badcases([{"id": 1}], [])
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json}\n")
    with pytest.raises(PrecisionInputError, match="malformed JSON"):
        pick_badcases(bad, bad)
