"""compare_dumps' per-record results, its text, JSON and CSV reports, the compare command
line, and an msprobe dump compared and localized."""

from __future__ import annotations

import csv
import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from pytest_precision import (
    DumpComparison,
    DumpFormatError,
    PrecisionInputError,
    TensorComparison,
    compare_dumps,
    load_dump,
)
from pytest_precision.cli import main
from pytest_precision.compare._results import layer_of
from pytest_precision.report import render, write_csv, write_json

REPO = Path(__file__).resolve().parents[2]


# -- records and reports ---------------------------------------------------------------------------


def test_records_pair_every_slot_with_metrics(dumps: Callable[..., Path]) -> None:
    result = compare_dumps(dumps("tensor"), dumps("tensor", "mix", "bf16"))
    tensors = [r for r in result.records if isinstance(r.metrics, TensorComparison)]
    assert tensors
    weight = next(r for r in result.records if r.slot == "parameters.weight")
    assert (weight.golden_dtype, weight.target_dtype) == ("float32", "bfloat16")
    assert weight.status == "pass"  # an fp32 weight rounded to bf16 passes the bf16 standard
    dtype_args = [r for r in result.records if r.reason.startswith("dtype ")]
    assert dtype_args
    assert {r.status for r in dtype_args} == {"warn"}
    # an fp32 upcast of bf16 data is judged as bf16 data: the call's lowest precision
    upcasts = [r for r in result.records if r.op == "to" and r.slot == "output.0"]
    assert any(r.target_dtype == "float32" and r.status == "pass" for r in upcasts)


def test_report_json_and_csv(dumps: Callable[..., Path], tmp_path: Path) -> None:
    result = compare_dumps(dumps("tensor"), dumps("tensor", "mix", "weight"))
    text = render(result, worst=3)
    lines = text.splitlines()
    assert lines[0].startswith("golden:  ")
    assert "first divergence: Functional.linear.13.forward, step 0 rank 0" in text
    assert "layer: model.layers.1" in text
    assert "metrics: cosine" in text
    assert "worst calls (3 of" in text
    assert len(lines) <= 20
    write_json(result, tmp_path / "out.json")
    document = json.loads((tmp_path / "out.json").read_text())
    assert document["passed"] is False
    assert document["first_divergence"]["module"] == "model.layers.1.mlp.down_proj"
    assert len(document["records"]) == len(result.records)
    write_csv(result, tmp_path / "out.csv")
    with (tmp_path / "out.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(result.records)
    assert {"name", "slot", "status", "cosine", "error_level"} <= set(rows[0])


def test_progress_is_reported_per_call(dumps: Callable[..., Path]) -> None:
    seen: list[tuple[int, int]] = []
    result = compare_dumps(
        dumps("statistics"), dumps("statistics"), progress=lambda *a: seen.append(a)
    )
    total = len(load_dump(dumps("statistics")).calls)
    assert seen == [(i, total) for i in range(1, total + 1)]
    assert result.matched_calls == total


def test_a_standard_applies_to_every_record(dumps: Callable[..., Path]) -> None:
    result = compare_dumps(dumps("tensor"), dumps("tensor", "mix", "bf16"), standard="exact")
    tensors = [r for r in result.records if isinstance(r.metrics, TensorComparison)]
    assert {r.metrics.standard.name for r in tensors} == {"exact"}  # type: ignore[union-attr]


def test_bad_input_is_refused_clearly(dumps: Callable[..., Path], tmp_path: Path) -> None:
    golden = dumps("statistics")
    with pytest.raises(PrecisionInputError, match="unknown standard 'close'"):
        compare_dumps(golden, golden, standard="close")  # type: ignore[arg-type]
    with pytest.raises(PrecisionInputError, match="reference standard needs a float64"):
        compare_dumps(golden, golden, standard="reference")
    with pytest.raises(PrecisionInputError, match="a Dump or a path"):
        compare_dumps(golden, 3)  # type: ignore[arg-type]
    with pytest.raises(DumpFormatError, match="no such file or directory"):
        compare_dumps(golden, tmp_path / "missing")


def test_layer_of_module_paths() -> None:
    assert layer_of("model.layers.12.self_attn.o_proj") == "model.layers.12"
    assert layer_of("transformer.h.3.attn") == "transformer.h.3"
    assert layer_of("encoder.layer.0") == "encoder.layer.0"
    assert layer_of("model.embed_tokens") is None
    assert layer_of(None) is None


# -- command line ----------------------------------------------------------------------------------


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["compare", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_exit_status_and_files(
    dumps: Callable[..., Path], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    golden = str(dumps("statistics"))
    code, out, _ = _cli(capsys, golden, golden)
    assert code == 0
    assert "no divergence" in out
    json_file, csv_file = tmp_path / "c.json", tmp_path / "c.csv"
    weight = str(dumps("statistics", "mix", "weight"))
    args = (golden, weight, "--json", str(json_file), "--csv", str(csv_file), "--worst", "1")
    code, out, _ = _cli(capsys, *args)
    assert code == 1
    assert "first divergence: Functional.linear.13.forward" in out
    assert "worst calls (1 of" in out
    assert json.loads(json_file.read_text())["first_divergence"]["cause"] == "source"
    assert csv_file.read_text().startswith("name,golden_name,kind,op,slot")
    code, out, err = _cli(capsys, golden, str(tmp_path / "missing"))
    assert (code, out) == (2, "")
    assert err.startswith("pytest-precision compare: error: ")


def test_dump_comparison_passed_mirrors_first_divergence(dumps: Callable[..., Path]) -> None:
    result: DumpComparison = compare_dumps(
        dumps("statistics"), dumps("statistics", "mix", "weight")
    )
    assert result.passed is (result.first_divergence is None)
    assert not result.passed


def test_msprobe_dumps_compare_and_localize(tmp_path: Path) -> None:
    """A broken gelu kernel in an msprobe dump: the inputs match, the output does not, and a
    float64 rerun from the recorded input convicts the op."""
    golden = REPO / "fixtures" / "msprobe" / "mix_tensor_steps"
    target = tmp_path / "target"
    shutil.copytree(golden, target)
    for pt in target.glob("step0/*/dump_tensor_data/*GELU.forward.0.output.0.pt"):
        _perturb(pt)
    for pt in target.glob("step0/*/dump_tensor_data/Functional.gelu.0.forward.output.0.pt"):
        _perturb(pt)
    result = compare_dumps(golden, target)
    d = result.first_divergence
    assert d is not None
    assert (d.cause, d.name, d.module, d.step) == (
        "rerun",
        "Functional.gelu.0.forward",
        "block.act",
        0,
    )
    assert result.unmatched == []
    assert compare_dumps(golden, golden).counts()["fail"] == 0


def _perturb(pt: Path) -> None:
    tensor = torch.load(pt, weights_only=True)
    torch.save(tensor * 1.05, pt)
