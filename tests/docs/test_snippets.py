"""The snippets of README.md and docs/ run.

Every Python block compiles and every ``$ pytest-precision ...`` line parses with the real CLI
(usage synopses with ``[...]`` excepted). Then the blocks run: the tutorials (``EXECUTED``:
diagnose, migrating-from-msprobe, troubleshooting) top to bottom in one namespace, in
a fresh folder; README.md and the reference docs (``WITH_SETUP``) each block in a fresh copy of
a shared setup. Commands run through the CLI and must answer (exit 0 or 1), never fail (2).
(quickstart.md runs as separate files: tests/docs/test_quickstart.py.)

Setups the test supplies:

- ``troubleshooting.md`` uses ``golden``, ``target``, ``ids``: a tiny random-init Llama, its
  copy with layer 0's MLP weight scaled by 3, and a 6-token prompt.
- README.md and the reference docs: ``tests/docs/readme_setup.py`` builds what their snippets
  name: the example decoder as ``model`` (``tokens``, ``prompt_ids``, ``generate``), a tiny HF
  Llama as ``gpu_model`` / ``golden_model`` / ``golden`` and clean copies (``target``,
  ``target_model``), a copy with a wrong weight as ``npu_model``, tensors (``out``,
  ``expected``, ``gpu_out``, ``npu_out``, ``fp64_out``, ``x``, ``layer``), capture dumps
  ``dumps/gpu`` (also ``dumps/run1``) and ``dumps/npu`` (also ``dumps/target``), saved runs
  ``runs/gpu`` and ``runs/npu``, msprobe's fixture as ``msprobe_dump/``, a checkpoint folder
  ``ckpt/``, eval and token files, a stand-in tokenizer ``tok``.

Markers on the line before a block: ``<!-- snippet: parse-only (why) -->`` compiles it (and
parses its commands) without running it: it needs hardware this machine lacks (an NPU);
``<!-- snippet: raises NAME -->`` runs it and expects the exception class NAME (a documented
failure). Not run: ``bash`` blocks (they create virtual environments and install torch, or run
the whole suite; CI runs exactly those) and blocks without a language (printed output).
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

sys.path.insert(0, str(Path(__file__).parent))  # readme_setup.py, beside this file

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^(?:<!-- snippet: ([^\n]*?) -->\n)?```(\w*)\n(.*?)^```", re.S | re.M)
EXECUTED = [
    pytest.param("diagnose.md", marks=pytest.mark.slow),
    "migrating-from-msprobe.md",
    "troubleshooting.md",
]


def _blocks(doc: Path, *, runnable: bool = False) -> list[tuple[str, str]]:
    """(language, code) of each fenced block; ``runnable`` leaves out parse-only ones."""
    return [
        (m.group(2), m.group(3))
        for m in FENCE.finditer(doc.read_text())
        if not (runnable and (m.group(1) or "").startswith("parse-only"))
    ]


def _expected_failures(doc: Path) -> dict[str, str]:
    """Code of each block marked ``<!-- snippet: raises NAME -->`` -> the exception's name."""
    return {
        m.group(3): m.group(1).split()[1]
        for m in FENCE.finditer(doc.read_text())
        if (m.group(1) or "").startswith("raises ")
    }


def _run_doc(doc: Path, setup: dict[str, Any], *, tutorial: bool = False) -> int:
    """Run the doc's Python blocks and its commands. Each block runs in a fresh copy of
    ``setup``, or (``tutorial``: a page read top to bottom) all in one namespace."""
    from pytest_precision.cli import main

    namespace = {**setup, "__name__": "doc"}

    failures = _expected_failures(doc)
    ran = 0
    for number, (language, code) in enumerate(_blocks(doc, runnable=True)):
        if language == "python":
            compiled = compile(code, f"{doc.name} block {number}", "exec")
            if code in failures:
                try:
                    exec(compiled, namespace if tutorial else {**setup, "__name__": "doc"})
                except Exception as exc:  # the marker names the class the doc says it raises
                    assert type(exc).__name__ == failures[code], exc  # noqa: PT017
                else:
                    pytest.fail(f"{doc.name} block {number} should raise {failures[code]}")
            else:
                exec(compiled, namespace if tutorial else {**setup, "__name__": "doc"})
            ran += 1
        elif language == "console":
            for argv in _commands(code):
                status = main(argv)
                assert status in (0, 1), (
                    f"{doc.name}: pytest-precision {' '.join(argv)} -> {status}"
                )
                ran += 1
    return ran


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
    import torch
    from readme_setup import hf_pair

    golden, target = hf_pair()
    return {"golden": golden, "target": target, "ids": torch.tensor([[17, 200, 45, 3, 99, 120]])}


@pytest.mark.parametrize("name", EXECUTED)
def test_the_doc_runs(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("transformers")
    pytest.importorskip("hypothesis")
    (tmp_path / "fixtures").symlink_to(ROOT / "fixtures")
    monkeypatch.chdir(tmp_path)
    assert _run_doc(ROOT / "docs" / name, _setup(name), tutorial=True), f"{name}: nothing ran"
    assert os.listdir(tmp_path)


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """The folder and namespace ``readme_setup.py`` builds, shared by the docs that use it."""
    pytest.importorskip("transformers")
    folder = tmp_path_factory.mktemp("docs")
    previous = Path.cwd()
    os.chdir(folder)
    try:
        from readme_setup import readme_namespace

        return folder, readme_namespace()
    finally:
        os.chdir(previous)


#: Docs whose snippets name things the setup provides (README.md first).
WITH_SETUP = [
    "README.md",
    "docs/batch-invariance.md",
    "docs/compare.md",
    "docs/determinism.md",
    "docs/goldens-in-ci.md",
    "docs/readers.md",
    "docs/replay.md",
    "docs/output-checks.md",
    "docs/scale-out.md",
]


@pytest.mark.slow
@pytest.mark.parametrize("name", WITH_SETUP)
def test_the_doc_runs_with_the_setup(
    name: str, shared: tuple[Path, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    folder, setup = shared
    monkeypatch.chdir(folder)
    assert _run_doc(ROOT / name, setup) >= 1
