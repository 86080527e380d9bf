"""``pytest-precision batch --entry``: the verdict per case, and the exit status."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from pytest_precision.cli import main

TESTS = Path(__file__).resolve().parents[1]


def _entry(tmp_path: Path, bug: str | None) -> str:
    source = f"""
        import sys
        sys.path[:0] = [{str(TESTS)!r}, {str(TESTS / "diagnosis")!r}]
        from hf_zoo import ARCHS, build
        from batch_bugs import BUGS

        BUG = {bug!r}

        def pair():
            model = build("llama")
            if BUG is not None:
                BUGS[BUG](model, ARCHS["llama"])
            return {{"model": model, "prompts": [[5, 17, 99, 42], [9, 3, 120, 33, 81, 12]]}}
    """
    path = tmp_path / "entry.py"
    path.write_text(textwrap.dedent(source))
    return f"{path}:pair"


def test_a_padding_bug_exits_1_and_names_the_attention(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["batch", "--entry", _entry(tmp_path, "padding_mask"), "--batch-size", "2"])
    out, err = capsys.readouterr()
    assert code == 1
    assert "batch invariance: bug" in out
    assert "bug at model.layers.1.self_attn" in out
    assert err.count("prompt ") == 2  # progress: a line per case


def test_a_clean_model_exits_0_unless_bitwise(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    entry = _entry(tmp_path, None)
    assert main(["batch", "--entry", entry, "--batch-size", "2"]) == 0
    assert "batch invariance: noise (2 cases)" in capsys.readouterr().out
    assert main(["batch", "--entry", entry, "--batch-size", "2", "--bitwise"]) == 1


def test_an_entry_without_prompts_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "entry.py"
    path.write_text("def pair():\n    return {'model': None}\n")
    assert main(["batch", "--entry", f"{path}:pair"]) == 2
    assert "must return a dict with model, prompts" in capsys.readouterr().err
