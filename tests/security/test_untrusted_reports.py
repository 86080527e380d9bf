"""A dump is untrusted input: the names in it (calls, modules, environment values) cannot turn
a report against its reader. Each payload is planted in a real capture of a tiny model (the
guilty call's name and its module renamed in both dumps), then every renderer runs on it: the
HTML pages show it only as text, the CSV keeps it from being a formula, and the terminal (CLI,
plugin summary, failure messages) receives no control character from it."""

from __future__ import annotations

import csv
import json
import re
import shutil
from html.parser import HTMLParser
from pathlib import Path

import pytest
import torch
from browser_helpers import rendered_dom

from pytest_precision import capture, compare_dumps
from pytest_precision._text import shown, shown_text, spreadsheet_cell
from pytest_precision.cli import main
from pytest_precision.diagnosis._results import Diagnosis, DiagnosisStep
from pytest_precision.report import write_csv
from pytest_precision.report._diagnosis import diagnosis_text
from pytest_precision.report._dumps import shard_failure_text
from pytest_precision.report._goldens import golden_summary_lines
from pytest_precision.report._html import diagnosis_html, dump_comparison_html, write_html

#: The call the weight change below makes guilty, and its module.
CULPRIT, MODULE = "Functional.linear.0.forward", "a"

PAYLOADS = {
    "data-placeholder": "%DATA%<img src=x onerror=alert(1)>",
    "comment-script": "<!--<script>",
    "close-script": "</script><script>alert(1)</script>",
    "line-separators": "a\u2028b\u2029c",
    "hyperlink": '=HYPERLINK("http://x")',
    "plus": "+1",
    "at-sum": "@SUM(A1:A9)",
    "tab-cr": "\tx\ry",
    "osc-title": "\x1b]0;x\x07",
    "clear-screen": "\x1b[2J first divergence: none (all pass)",
    "forged-line": "x\nfirst divergence: none (all pass)",
    "c1-csi": "\x9b2J",
    "bidi": "\u202eevil\u202c \u2066x\u2069 \u202a\u202b\u202d",
}

FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
#: What a terminal may act on: C0 but line breaks and tabs, DEL, C1, bidi controls.
TERMINAL_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
FORGED = "first divergence: none"


class _Tree(HTMLParser):
    """The start tags of a page, the text of its title and of its JSON script block."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.text: dict[str, str] = {}
        self._in: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self._in = "data" if ("id", "data") in attrs else tag

    def handle_endtag(self, tag: str) -> None:
        self._in = None

    def handle_data(self, data: str) -> None:
        if self._in is not None:
            self.text[self._in] = self.text.get(self._in, "") + data


@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A golden and a target capture of a two-layer model; the target's first weight is off,
    so its first linear call is guilty."""
    root = tmp_path_factory.mktemp("captured")
    torch.manual_seed(0)
    model = torch.nn.Sequential()
    model.add_module("a", torch.nn.Linear(4, 4))
    model.add_module("b", torch.nn.Linear(4, 4))
    x = torch.randn(2, 4)
    with torch.no_grad(), capture(model, root / "golden"):
        model(x)
    with torch.no_grad():
        model.a.weight[0, 0] += 5.0  # large enough for negative SQNRs downstream
    with torch.no_grad(), capture(model, root / "target"):
        model(x)
    return root / "golden", root / "target"


def _renamed(captured: tuple[Path, Path], out: Path, name: str, module: str) -> tuple[Path, Path]:
    """Both dumps with the guilty call renamed ``name`` and its module ``module`` (and a value of
    the recorded environment set to ``name``), as another machine could have written them."""
    renamed = []
    for source in captured:
        dump = out / source.name
        shutil.copytree(source, dump)
        records = dump / "rank0" / "records.jsonl"
        lines = []
        for line in records.read_text().splitlines():
            record = json.loads(line)
            for key, old, new in (("name", CULPRIT, name), ("parent", CULPRIT, name)):
                if record[key] == old:
                    record[key] = new
            if record["module"] == MODULE:
                record["module"] = module
            lines.append(json.dumps(record))
        records.write_text("\n".join(lines) + "\n")
        manifest = json.loads((dump / "manifest.json").read_text())
        manifest["environment"]["note"] = name
        (dump / "manifest.json").write_text(json.dumps(manifest))
        renamed.append(dump)
    return renamed[0], renamed[1]


@pytest.fixture(params=list(PAYLOADS), ids=list(PAYLOADS))
def payload(request: pytest.FixtureRequest) -> str:
    return PAYLOADS[request.param]


@pytest.fixture
def planted(captured: tuple[Path, Path], tmp_path: Path, payload: str) -> tuple[Path, Path]:
    return _renamed(captured, tmp_path, payload, f"model.layers.0.{payload}")


def _diagnosis(result: object, out: Path) -> Diagnosis:
    divergence = result.first_divergence  # type: ignore[attr-defined]
    return Diagnosis(
        finding="tokens",
        first_token=(2,),
        tokens=None,  # type: ignore[arg-type]  (no renderer reads it)
        golden_tokens=((1, 2, 3),),
        target_tokens=((1, 2, 4),),
        step=0,
        comparison=result,  # type: ignore[arg-type]
        divergence=divergence,
        replay=None,
        replays=(),
        exported_test=None,
        report=None,
        config_diff=None,
        environment_diff=None,
        weight_changes=(),
        steps=(DiagnosisStep("localize", f"culprit {divergence.name}"),),
        out=out,
    )


def _assert_markup_free(page: str, name: str, title: str) -> None:
    tree = _Tree()
    tree.feed(page)
    tree.close()
    assert "img" not in tree.tags
    assert tree.tags.count("script") == 2  # the JSON block and the page's own script
    assert tree.text["title"] == title  # the name as text, %DATA% not filled in
    block = tree.text["data"]
    assert not set(block) & {"<", ">", "&", "\u2028", "\u2029"}
    data = json.loads(block)
    comparison = data.get("comparison") or data
    assert comparison["divergence"]["name"] == name
    assert name in [r["name"] for r in comparison["records"]]


def test_the_html_pages_show_a_name_only_as_text(
    planted: tuple[Path, Path], payload: str, tmp_path: Path
) -> None:
    result = compare_dumps(*planted)
    assert result.first_divergence is not None
    assert result.first_divergence.name == payload
    page = dump_comparison_html(result)
    _assert_markup_free(page, payload, f"pytest-precision: {result.verdict}")
    diagnosis = diagnosis_html(_diagnosis(result, tmp_path))
    _assert_markup_free(diagnosis, payload, f"pytest-precision diagnosis: tokens - {payload}")


def test_the_page_script_inserts_data_as_text_only() -> None:
    """The page builds its DOM from text nodes and attribute values: no HTML string from the
    data is ever parsed."""
    script = dump_comparison_html.__globals__["_TEMPLATE"]
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
        assert sink not in script


def test_the_csv_keeps_names_from_being_formulas(
    planted: tuple[Path, Path], payload: str, tmp_path: Path
) -> None:
    result = compare_dumps(*planted)
    write_csv(result, tmp_path / "out.csv")
    with open(tmp_path / "out.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    names = [row["name"] for row in rows if row["name"].lstrip("'") == payload]
    assert names
    expected = "'" + payload if payload.startswith(FORMULA_START) else payload
    assert set(names) == {expected}
    for row in rows:
        for column in ("name", "golden_name", "module", "op", "slot", "reason"):
            assert not row[column].startswith(FORMULA_START), (column, row[column])
    numbers = [row[c] for row in rows for c in ("cosine", "sqnr_db") if row.get(c)]
    assert all(isinstance(float(n), float) for n in numbers)  # no quote in front of a number
    assert any(n.startswith("-") for n in numbers)  # a negative float stays a number


def test_a_cell_is_neutralised_only_when_it_is_a_string() -> None:
    assert spreadsheet_cell(-1.5e-3) == -1.5e-3
    assert spreadsheet_cell(-3) == -3
    assert spreadsheet_cell("-inf") == "-inf"  # how this package writes a non-finite float
    assert spreadsheet_cell("-1+cmd") == "'-1+cmd"
    assert spreadsheet_cell("a=b") == "a=b"
    assert spreadsheet_cell(None) is None


def _assert_terminal_safe(text: str) -> None:
    assert not TERMINAL_CONTROL.search(text), repr(TERMINAL_CONTROL.search(text))
    assert not any(line.lstrip().startswith(FORGED) for line in text.splitlines())


def test_the_cli_prints_no_control_character_from_a_dump(
    planted: tuple[Path, Path], payload: str, capsys: pytest.CaptureFixture[str]
) -> None:
    golden, target = planted
    assert main(["compare", str(golden), str(target)]) == 1
    compared = capsys.readouterr()
    assert shown(payload) in compared.out  # shown, escaped, not dropped
    assert main(["inspect", str(target)]) == 0
    assert main(["inspect", str(target), "--list"]) == 0
    listed = capsys.readouterr()
    assert shown(payload) in listed.out
    main(["replay", str(target), payload, "--golden", str(golden), "--device", "cpu"])
    replayed = capsys.readouterr()
    assert shown(payload) in replayed.out + replayed.err
    for text in (compared, listed, replayed):
        _assert_terminal_safe(text.out + text.err)


def test_the_failure_messages_and_summaries_escape_names(
    planted: tuple[Path, Path], payload: str, tmp_path: Path
) -> None:
    result = compare_dumps(*planted)
    _assert_terminal_safe(diagnosis_text(_diagnosis(result, tmp_path)))
    culprits = [result.first_divergence]
    _assert_terminal_safe(shard_failure_text("step 0", culprits, result.records))  # type: ignore[list-item]
    record = {"status": "fail", "test": f"t.py::{payload}", "name": payload, "message": payload}
    _assert_terminal_safe("\n".join(golden_summary_lines([record], **_NO_GOLDEN_DIR)))
    worst = {"path": payload, "cosine": 0.5, "max_abs_err": 1.0, "max_rel_err": 1.0}
    scored = {**record, "standard": "fp32", "worst": {**worst, "mismatch_count": 1, "numel": 4}}
    _assert_terminal_safe("\n".join(golden_summary_lines([scored], **_NO_GOLDEN_DIR)))


_NO_GOLDEN_DIR: dict[str, object] = {
    "golden_dir": None,
    "unused": None,
    "pruned": False,
    "prune_skipped_because": None,
    "report_path": None,
}


def test_the_plugin_summary_escapes_names(
    pytester: pytest.Pytester, captured: tuple[Path, Path], tmp_path: Path
) -> None:
    name = PAYLOADS["clear-screen"] + PAYLOADS["forged-line"] + PAYLOADS["bidi"]
    golden, target = _renamed(captured, tmp_path, name, PAYLOADS["osc-title"])
    result = pytester.runpytest("--precision-compare", str(golden), str(target))
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    output = "\n".join(result.outlines + result.errlines)
    assert "dump comparison (pytest-precision)" in output
    assert shown(name) in output
    _assert_terminal_safe(output)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("\x1b[2J", "\\x1b[2J"),
        ("a\nb\tc", "a\\x0ab\\x09c"),
        ("\x7f\x9b", "\\x7f\\x9b"),
        ("\u202eab\u2069", "\\u202eab\\u2069"),
        ("model.layers.0.mlp", "model.layers.0.mlp"),
        ("Ünïcode ✓ 名前", "Ünïcode ✓ 名前"),
    ],
)
def test_shown_escapes_exactly_the_control_characters(text: str, expected: str) -> None:
    assert shown(text) == expected


def test_shown_text_keeps_the_reports_own_lines() -> None:
    assert shown_text("a\x1b[31m\nb\tc\u202e") == "a\\x1b[31m\nb\tc\\u202e"


def test_the_page_runs_no_planted_script_in_chromium(
    captured: tuple[Path, Path], tmp_path: Path
) -> None:
    marker = "document.body.setAttribute('data-pwned','1')"
    name = f'%DATA%<img src=x onerror="{marker}"></script><script>{marker}</script>'
    golden, target = _renamed(captured, tmp_path, name, f"<!--<script>{marker}")
    result = compare_dumps(golden, target)
    page = write_html(tmp_path / "page.html", dump_comparison_html(result))
    dom = rendered_dom(page, tmp_path / "profile")
    assert 'data-rendered="yes"' in dom  # the page's own script ran to the end
    assert 'data-pwned="' not in dom  # the marker is there as text, never as an attribute
    assert "<img" not in dom
