"""The snippets of README.md and docs/: every Python block compiles and every
``$ pytest-precision ...`` line parses with the real CLI; the docs in ``EXECUTED`` run for real,
block after block in one namespace, in a fresh folder, with their commands run through the CLI
(exit 0 or 1: an answer, never 2, an error).

Setup blocks the test supplies (documented here, named in the doc's prose):

- ``troubleshooting.md`` uses ``golden``, ``target``, ``ids``: a tiny random-init Llama, its
  copy with layer 0's MLP weight scaled by 3, and a 6-token prompt.
- ``README.md``: ``tests/docs/readme_setup.py`` builds what its snippets name (a tiny HF Llama
  as ``model`` / ``gpu_model``, a copy with a wrong weight as ``npu_model``, tensors, capture
  dumps ``dumps/gpu`` and ``dumps/npu``, saved runs ``runs/gpu`` and ``runs/npu``, msprobe's
  fixture as ``msprobe_dump/``, eval and token files); each block runs in a fresh copy of it.

A block preceded by ``<!-- snippet: parse-only (why) -->`` is compiled (its commands parsed)
but not run: it needs hardware this machine lacks (an NPU). Not run either: ``bash`` blocks
(they create virtual environments and install torch, or run the whole suite: CI runs them) and
blocks without a language (printed output). The older docs' snippets are compiled and their
commands parsed.
"""

from __future__ import annotations

import ast
import os
import re
import shlex
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^(<!-- snippet: parse-only[^\n]*-->\n)?```(\w*)\n(.*?)^```", re.S | re.M)
EXECUTED = [
    pytest.param("quickstart.md", marks=pytest.mark.slow),  # saves two runs: ~15 s
    pytest.param("diagnose.md", marks=pytest.mark.slow),
    "migrating-from-msprobe.md",
    "troubleshooting.md",
]


def _blocks(doc: Path, *, runnable: bool = False) -> list[tuple[str, str]]:
    """(language, code) of each fenced block; ``runnable`` leaves out parse-only ones."""
    return [
        (m.group(2), m.group(3))
        for m in FENCE.finditer(doc.read_text())
        if not (runnable and m.group(1))
    ]


def _commands(code: str) -> list[list[str]]:
    out = []
    for line in code.splitlines():
        line = line.split("  #", 1)[0].strip()
        if line.startswith("$ pytest-precision") and " [" not in line:  # not a usage synopsis
            out.append(shlex.split(line)[2:])
    return out


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_python_block_compiles_and_every_command_parses(doc: Path) -> None:
    from pytest_precision.cli import build_parser

    parser = build_parser()
    for language, code in _blocks(doc):
        if language == "python":
            ast.parse(code, filename=str(doc))
        if language in ("console", "bash"):
            for argv in _commands(code):
                try:
                    parser.parse_args(argv)
                except SystemExit:  # pragma: no cover - the message names the command
                    pytest.fail(f"{doc.name}: pytest-precision {' '.join(argv)} does not parse")


def _setup(name: str) -> dict[str, Any]:
    if name != "troubleshooting.md":
        return {}
    import copy

    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        initializer_range=0.5,
    )
    golden = transformers.LlamaForCausalLM(config).eval()
    target = copy.deepcopy(golden)
    with torch.no_grad():
        target.model.layers[0].mlp.down_proj.weight.mul_(3.0)
    return {"golden": golden, "target": target, "ids": torch.tensor([[17, 200, 45, 3, 99, 120]])}


@pytest.mark.parametrize("name", EXECUTED)
def test_the_doc_runs(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("transformers")
    pytest.importorskip("hypothesis")
    from pytest_precision.cli import main

    (tmp_path / "fixtures").symlink_to(ROOT / "fixtures")
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, Any] = {"__name__": f"doc_{name}", **_setup(name)}
    ran = 0
    for language, code in _blocks(ROOT / "docs" / name, runnable=True):
        if language == "python":
            exec(compile(code, f"docs/{name}", "exec"), namespace)
            ran += 1
        elif language == "console":
            for argv in _commands(code):
                code_ = main(argv)
                assert code_ in (0, 1), f"{name}: pytest-precision {' '.join(argv)} exited {code_}"
                ran += 1
    assert ran, f"{name} has nothing to run"
    assert os.listdir(tmp_path)


@pytest.mark.slow
def test_the_readme_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("transformers")
    from pytest_precision.cli import main

    monkeypatch.chdir(tmp_path)
    sys.path.insert(0, str(Path(__file__).parent))
    from readme_setup import readme_namespace

    setup = readme_namespace()
    ran = 0
    for number, (language, code) in enumerate(_blocks(ROOT / "README.md", runnable=True)):
        if language == "python":
            exec(
                compile(code, f"README.md block {number}", "exec"), {**setup, "__name__": "readme"}
            )
            ran += 1
        elif language == "console":
            for argv in _commands(code):
                status = main(argv)
                assert status in (0, 1), (
                    f"README: pytest-precision {' '.join(argv)} exited {status}"
                )
                ran += 1
    assert ran >= 15
