"""The diagnose CLI (saved runs, an entry point), compare --html, assert_same_generation, and
the HTML report rendered in headless Chromium (skipped with a reason where none is installed)."""

from __future__ import annotations

import json
import re
import subprocess
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from browser_helpers import browser_flags, rendered_dom  # noqa: E402
from planted import build, twin  # noqa: E402

from pytest_precision import assert_same_generation, diagnose, save_run  # noqa: E402
from pytest_precision.cli import main  # noqa: E402
from pytest_precision.report import render_html  # noqa: E402

IDS = [[17, 200, 45, 3, 99, 120], [8, 77, 31, 150, 64, 12]]
BAD = "model.layers.0.mlp.down_proj"


def _bad(model: torch.nn.Module) -> torch.nn.Module:
    target = twin(model)
    with torch.no_grad():
        target.get_submodule(BAD).weight.mul_(3.0)
    return target


@pytest.fixture(scope="module")
def diagnosed(tmp_path_factory: pytest.TempPathFactory) -> object:
    golden = build("llama")
    return diagnose(
        golden,
        _bad(golden),
        IDS,
        max_new_tokens=6,
        out=tmp_path_factory.mktemp("diag"),
        render=render_html,
    )


def test_the_report_embeds_the_diagnosis_and_needs_no_network(diagnosed: object) -> None:
    page = Path(diagnosed.report).read_text()  # type: ignore[attr-defined]
    assert not re.search(r"(src|href)=[\"']?(https?:)?//", page)  # no CDN, no remote asset
    data = json.loads(re.search(r'id="data">(.*?)</script>', page, re.S).group(1))  # type: ignore[union-attr]
    cmp = data["comparison"]
    assert cmp["divergence"]["module"] == BAD
    assert cmp["records"][cmp["culprit"]]["module"] == BAD
    layers = {layer["layer"] for layer in cmp["layers"]}
    # statistics found layer 0; tensors were captured up to it, not for the later layer
    assert "model.layers.0" in layers
    assert "model.layers.1" not in layers
    assert [s["name"] for s in data["steps"]][:4] == ["config", "weights", "generation", "tokens"]
    assert data["weights"][0]["key"] == BAD + ".weight"


def test_the_report_renders_in_headless_chromium(diagnosed: object, tmp_path: Path) -> None:
    page = Path(diagnosed.report).resolve()  # type: ignore[attr-defined]
    flags = browser_flags(tmp_path / "profile")
    shot = tmp_path / "report.png"
    subprocess.run(
        [*flags, f"--screenshot={shot}", page.as_uri()],
        check=True,
        capture_output=True,
        timeout=120,
    )
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert shot.stat().st_size > 20_000
    dom = rendered_dom(page, tmp_path / "profile")
    assert 'data-rendered="yes"' in dom  # the script ran to the end
    assert 'class="culprit ' in dom
    assert 'id="culprit"' in dom
    assert re.search(r"\d+ of \d+ records", dom)


@pytest.mark.slow
def test_cli_diagnose_two_saved_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    golden = build("llama")
    save_run(golden, IDS, tmp_path / "gpu", max_new_tokens=6)
    save_run(_bad(golden), IDS, tmp_path / "npu", max_new_tokens=6)
    html = tmp_path / "d.html"
    code = main(
        [
            "diagnose",
            str(tmp_path / "gpu"),
            str(tmp_path / "npu"),
            "--out",
            str(tmp_path / "out"),
            "--html",
            str(html),
        ]
    )
    out = capsys.readouterr().out
    assert code == 1
    assert f"in {BAD} (layer model.layers.0), cause source" in out
    assert html.is_file()
    assert (tmp_path / "out" / "report.html").is_file()
    assert main(["diagnose", str(tmp_path / "gpu")]) == 2


def test_cli_diagnose_an_entry_point(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    entry = tmp_path / "models.py"
    entry.write_text(
        textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from planted import build, twin

        def pair():
            golden = build("gpt2")
            return {{"golden": golden, "target": twin(golden), "input_ids": {IDS!r}}}
    """)
    )
    code = main(
        [
            "diagnose",
            "--entry",
            f"{entry}:pair",
            "--out",
            str(tmp_path / "o"),
            "--max-new-tokens",
            "4",
        ]
    )
    assert code == 0, capsys.readouterr().out
    assert "tokens: no difference" in capsys.readouterr().out
    bad_factor = ["diagnose", "--entry", f"{entry}:pair", "--out", str(tmp_path / "p")]
    assert main([*bad_factor, "--noise-factor", "0"]) == 2
    assert "noise_factor must be a positive number" in capsys.readouterr().err


def test_compare_html(diagnosed: object, tmp_path: Path) -> None:
    d = diagnosed
    page = tmp_path / "c.html"
    code = main(
        [
            "compare",
            str(d.comparison.golden.path),
            str(d.comparison.target.path),  # type: ignore[attr-defined]
            "--html",
            str(page),
        ]
    )
    assert code == 1
    assert '"cause": "source"' in page.read_text()


def test_compare_makes_missing_folders_for_every_output(diagnosed: object, tmp_path: Path) -> None:
    d = diagnosed
    dumps = [str(d.comparison.golden.path), str(d.comparison.target.path)]  # type: ignore[attr-defined]
    outputs = {"--html": tmp_path / "a" / "c.html", "--json": tmp_path / "b" / "c.json"}
    outputs["--csv"] = tmp_path / "c" / "c.csv"
    args = [item for option, path in outputs.items() for item in (option, str(path))]
    assert main(["compare", *dumps, *args]) == 1
    assert all(path.is_file() for path in outputs.values())


def test_assert_same_generation(tmp_path: Path) -> None:
    golden = build("llama")
    assert_same_generation(golden, twin(golden), IDS, max_new_tokens=6, out=tmp_path / "a")
    with pytest.raises(AssertionError) as failure:
        assert_same_generation(golden, _bad(golden), IDS, max_new_tokens=6, out=tmp_path / "b")
    message = str(failure.value)
    assert message.startswith("culprit: ")
    assert BAD in message
    assert message.count("report: ") == 1
    assert f"report: {tmp_path / 'b' / 'report.html'}" in message
    assert "exported test" not in message  # a wrong weight: nothing to replay, nothing exported


def test_assert_same_generation_leaves_no_temporary_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    golden = build("llama")
    assert_same_generation(golden, twin(golden), IDS, max_new_tokens=3)
    assert not list(tmp_path.glob("precision-diagnosis-*"))


@pytest.mark.slow
def test_assert_same_generation_against_a_stored_golden(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        import torch
        from planted import build, twin
        from pytest_precision import assert_same_generation

        MODEL = build("llama")

        def test_generation(request):
            target = twin(MODEL)
            if request.config.getoption("--golden-update") is False:
                with torch.no_grad():
                    target.get_submodule({BAD!r}).weight.mul_(3.0)
            assert_same_generation(None, target, {IDS!r}, max_new_tokens=6,
                                   out=str(request.config.rootpath / "diag"))
    """)
    )
    pytester.runpytest_inprocess("--golden-dir", "goldens", "--golden-update").assert_outcomes(
        passed=1
    )
    pruned = pytester.runpytest_inprocess("--golden-dir", "goldens", "--golden-prune")
    pruned.stdout.no_fnmatch_line("*unused goldens*")  # the stored run is this test's
    pruned.stdout.no_fnmatch_line("*left alone*")
    result = pytester.runpytest_inprocess("--golden-dir", "goldens")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"*culprit: *{BAD}*", "*report: *report.html*"])


def test_precision_html_lists_the_session_goldens(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import torch
        from pytest_precision import assert_close_to_golden

        def test_a():
            assert_close_to_golden(torch.ones(4), name="out")
        """
    )
    assert pytester.runpytest_inprocess("--golden-dir", "g", "--golden-update").ret == 0
    pytester.runpytest_inprocess("--golden-dir", "g", "--precision-html", "s.html").assert_outcomes(
        passed=1
    )
    page = (pytester.path / "s.html").read_text()
    rows = json.loads(re.search(r'id="data">(.*?)</script>', page, re.S).group(1))["goldens"]
    assert [(r["name"], r["status"]) for r in rows] == [("out", "pass")]
