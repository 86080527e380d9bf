"""`pytest-precision tokens A B` and `pytest-precision badcases A B`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_precision.cli import main


def test_tokens_from_json_jsonl_and_text(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    golden, target = tmp_path / "golden.json", tmp_path / "target.jsonl"
    golden.write_text(json.dumps({"ids": [[0, 5, 6, 7], [1, 2, 3, 0]]}))
    target.write_text('{"ids": [0, 5, 6, 7]}\n[1, 2, 4]\n')
    assert main(["tokens", str(golden), str(target), "--pad-id", "0"]) == 1
    out = capsys.readouterr().out
    assert "1 of 2 row(s) agree" in out
    assert "row 1: tokens diverge at position 2: golden 3 vs target 4" in out
    text = tmp_path / "same.txt"
    text.write_text("5 6 7\n1,2,3\n")
    assert main(["tokens", str(text), str(text)]) == 0
    single = tmp_path / "one.json"
    single.write_text("[5, 6, 7]")
    assert main(["tokens", str(single), str(single)]) == 0
    assert main(["tokens", str(single), str(text)]) == 2
    assert "compare the same requests" in capsys.readouterr().err


def test_tokens_reports_unreadable_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.txt"
    bad.write_text("1 2 x\n")
    assert main(["tokens", str(bad), str(bad)]) == 2
    assert "bad.txt:1: not a line of integer ids" in capsys.readouterr().err


def test_badcases(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    golden, target, report = tmp_path / "a.jsonl", tmp_path / "b.jsonl", tmp_path / "cases.json"
    golden.write_text(
        '{"id": 1, "prompt": "p1", "answer": "yes", "score": 1}\n'
        '{"id": 2, "prompt": "p2", "answer": "it is four", "score": 1}\n'
    )
    target.write_text(
        '{"id": 1, "prompt": "p1", "answer": "yes", "score": 1}\n'
        '{"id": 2, "prompt": "p2", "answer": "it is five", "score": 0}\n'
    )
    assert main(["badcases", str(golden), str(target), "--json", str(report)]) == 1
    out = capsys.readouterr().out
    assert "1 of 2 matched case(s) disagree" in out
    assert "localize case 2 first" in out
    (case,) = json.loads(report.read_text())
    assert case["key"] == "2"
    assert case["position"] == 2
    assert case["score_loss"] == 1.0
    assert main(["badcases", str(golden), str(golden)]) == 0
