"""Golden (library side): compare, record, rewrite, tolerances, environment, dumps as goldens."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import torch

import pytest_precision.dump
from pytest_precision import (
    Dump,
    DumpFormatError,
    Golden,
    PrecisionError,
    PrecisionInputError,
    Record,
    assert_close_to_golden,
)
from pytest_precision.golden import _sources
from pytest_precision.golden._active import activate, deactivate
from pytest_precision.golden._files import read_golden
from pytest_precision.golden._layout import MARKER
from pytest_precision.golden._tolerances import Tolerance, parse_tolerances

TEST_ID = "tests/test_model.py::test_layer[bf16]"


def _value(scale: float = 1.0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    return torch.randn(8, 16, generator=generator) * scale + 3


def _record(tmp_path: Path, **values: Any) -> Path:
    golden = Golden(tmp_path, TEST_ID, update=True)
    for name, value in values.items():
        assert golden(value, name) is None
    return golden.location


def test_record_then_compare(tmp_path: Path) -> None:
    location = _record(tmp_path, out=_value())
    assert location == tmp_path / "tests/test_model.py/test_layer[bf16].safetensors"
    assert (tmp_path / MARKER).is_file()
    comparison = Golden(tmp_path, TEST_ID)(_value(), "out")
    assert comparison is not None
    assert comparison.verdict == "pass"


def test_mismatch_fails_with_the_full_report_and_hint(tmp_path: Path) -> None:
    _record(tmp_path, out=_value())
    golden = Golden(tmp_path, TEST_ID, record_hint="python -m pytest X --golden-update")
    with pytest.raises(AssertionError) as info:
        golden(_value(1.05), "out")
    message = str(info.value)
    assert f"{TEST_ID}: golden mismatch (golden: {golden.location})" in message
    assert "out: FAIL under the ratio standard (shape (8, 16), float32)" in message
    assert "worst elements (abs error):" in message
    assert "would pass elementwise" in message
    assert message.endswith("re-record with:\n  python -m pytest X --golden-update")
    assert golden.records[0]["status"] == "fail"
    assert golden.records[0]["worst"]["max_rel_err"] > 0.001


def test_missing_golden_names_the_file(tmp_path: Path) -> None:
    golden = Golden(tmp_path, TEST_ID)
    with pytest.raises(AssertionError, match=r"no golden for 'out' .*does not exist"):
        golden(_value(), "out")
    _record(tmp_path, other=_value())
    with pytest.raises(AssertionError, match="has no such value"):
        Golden(tmp_path, TEST_ID)(_value(), "out")


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        (torch.zeros(4, 32), r"out: value is float32 of shape \(4, 32\), golden is float32 of"),
        (torch.zeros(8, 16, dtype=torch.bfloat16), r"value is bfloat16 of shape \(8, 16\), gol"),
        ({"a": torch.zeros(8, 16)}, "structure mismatch"),
    ],
)
def test_shape_dtype_and_structure_changes_fail_clearly(
    tmp_path: Path, value: Any, problem: str
) -> None:
    _record(tmp_path, out=_value())
    with pytest.raises(AssertionError, match=problem):
        Golden(tmp_path, TEST_ID)(value, "out")


def test_unnamed_values_follow_call_order(tmp_path: Path) -> None:
    recorder = Golden(tmp_path, TEST_ID, update=True)
    recorder(torch.ones(2))
    recorder(torch.zeros(3))
    assert set(read_golden(recorder.location).entries) == {"#0", "#1"}
    golden = Golden(tmp_path, TEST_ID)
    golden(torch.ones(2))
    golden(torch.zeros(3))
    with pytest.raises(PrecisionInputError, match="not starting with '#'"):
        golden(torch.ones(1), "#0")


def test_duplicate_name_is_rejected(tmp_path: Path) -> None:
    golden = Golden(tmp_path, TEST_ID, update=True)
    golden(torch.ones(2), "a")
    with pytest.raises(PrecisionInputError, match="'a' is used twice"):
        golden(torch.ones(2), "a")


def test_a_name_colliding_with_a_stored_tuple_item_is_rejected(tmp_path: Path) -> None:
    """``out`` as a tuple stores ``out[0]``: a value named ``out[0]`` would overwrite it."""
    recorder = Golden(tmp_path, TEST_ID, update=True)
    recorder((torch.ones(2), torch.ones(2)), "out")
    with pytest.raises(PrecisionInputError, match=r"'out' and 'out\[0\]' both store .*'out\[0\]'"):
        recorder(torch.full((2,), 7.0), "out[0]")
    later = Golden(tmp_path, TEST_ID, update=True)
    with pytest.raises(PrecisionInputError, match="rename one of them"):
        later(torch.full((2,), 7.0), "out[0]")
    first, second = Golden(tmp_path, TEST_ID).load("out")
    assert torch.equal(first, torch.ones(2))
    assert torch.equal(second, torch.ones(2))


@pytest.mark.parametrize(
    ("value", "tolerance", "call", "problem"),
    [
        (torch.ones(3), Tolerance(), {"standard": "ulps"}, "unknown standard 'ulps'"),
        (torch.ones(3), Tolerance(standard="bogus"), {}, "unknown standard 'bogus'"),
        (torch.ones(3, dtype=torch.complex64), Tolerance(), {}, "complex"),
    ],
    ids=["call-standard", "marker-standard", "complex"],
)
def test_unusable_tolerance_or_value_is_an_error_never_a_rewrite(
    tmp_path: Path, value: Any, tolerance: Tolerance, call: dict[str, Any], problem: str
) -> None:
    location = _record(tmp_path, x=torch.ones(3))
    before = location.read_bytes()
    for update in (False, True):
        golden = Golden(tmp_path, TEST_ID, update=update, tolerance=tolerance)
        with pytest.raises(PrecisionInputError, match=problem):
            golden(value, "x", **call)
        golden.flush(complete=True)
        assert [r["status"] for r in golden.records] == ["error"]
    assert location.read_bytes() == before


def test_update_rewrites_only_what_differs(tmp_path: Path) -> None:
    location = _record(tmp_path, same=_value(), changed=_value())
    before = read_golden(location)
    golden = Golden(tmp_path, TEST_ID, update=True)
    assert golden(_value(), "same") is not None
    assert golden(_value(2.0), "changed") is None
    assert [r["status"] for r in golden.records] == ["pass", "rewritten"]
    after = read_golden(location)
    assert after.value("same").equal(before.value("same"))
    assert after.value("changed").equal(_value(2.0))


def test_complete_update_drops_names_the_test_no_longer_uses(tmp_path: Path) -> None:
    location = _record(tmp_path, kept=_value(), gone=_value())
    golden = Golden(tmp_path, TEST_ID, update=True, autoflush=False)
    golden(_value(2.0), "kept")
    golden.flush(complete=False)
    assert set(read_golden(location).entries) == {"kept", "gone"}
    golden.flush(complete=True)
    assert set(read_golden(location).entries) == {"kept"}


def test_update_replaces_a_corrupt_file_but_never_a_newer_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    location = _record(tmp_path, out=_value())
    location.write_bytes(b"garbage")
    with pytest.raises(PrecisionError, match="corrupt golden file"):
        Golden(tmp_path, TEST_ID)(_value(), "out")
    golden = Golden(tmp_path, TEST_ID, update=True)
    golden(_value(), "out")
    assert golden.records[0]["status"] == "rewritten"
    assert read_golden(location).value("out").equal(_value())

    monkeypatch.setattr("pytest_precision.golden._files.SCHEMA_VERSION", 99)
    _record(tmp_path / "newer", out=_value())
    monkeypatch.undo()
    newer = Golden(tmp_path / "newer", TEST_ID, update=True)
    with pytest.raises(PrecisionError, match="newer pytest-precision"):
        newer(_value(), "out")
    # the failed comparison is the one report: flushing neither raises again nor writes
    before = newer.location.read_bytes()
    newer.flush(complete=False)
    newer.flush(complete=True)
    assert newer.location.read_bytes() == before


def test_tolerance_precedence_call_then_marker_then_dtype(tmp_path: Path) -> None:
    _record(tmp_path, a=_value(), b=_value(), c=_value(), d=_value())
    perturbed = _value() * 1.001  # fails float32's default ratio standard
    loose = {torch.float32: Tolerance(rtol=1e-2)}
    with pytest.raises(AssertionError):
        Golden(tmp_path, TEST_ID)(perturbed, "a")
    Golden(tmp_path, TEST_ID, dtype_tolerances=loose)(perturbed, "b")
    strict_marker = Golden(
        tmp_path, TEST_ID, tolerance=Tolerance(standard="exact"), dtype_tolerances=loose
    )
    with pytest.raises(AssertionError, match="exact standard"):
        strict_marker(perturbed, "c")
    strict_marker(perturbed, "d", rtol=1e-2)


def test_bfloat16_tolerance_applies_per_leaf(tmp_path: Path) -> None:
    value = {"f32": _value(), "bf16": _value().bfloat16()}
    _record(tmp_path, v=value)
    perturbed = {"f32": _value(), "bf16": (_value() * 1.02).bfloat16()}
    table = {torch.bfloat16: Tolerance(rtol=0.05)}
    comparison = Golden(tmp_path, TEST_ID, dtype_tolerances=table)(perturbed, "v")
    assert comparison is not None
    standards = {item.path: item.comparison.standard.name for item in comparison.items}
    assert standards == {"['f32']": "ratio", "['bf16']": "allclose"}


def test_parse_tolerances() -> None:
    table = parse_tolerances(
        ["bfloat16: rtol=1.6e-2 atol=1e-5", "", "float32: standard=ulp  # comment"]
    )
    assert table == {
        torch.bfloat16: Tolerance(rtol=1.6e-2, atol=1e-5),
        torch.float32: Tolerance(standard="ulp"),
    }


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("bfloat16 rtol=1", "expected 'DTYPE: key=value"),
        ("floaty: rtol=1", "expected 'DTYPE: key=value"),
        ("float32: rtol=abc", "rtol must be a number"),
        ("float32: rtol=-1", "rtol must be >= 0"),
        ("float32: tol=1", "'tol=1' is not standard=NAME"),
        ("float32: standard=fuzzy", "unknown standard 'fuzzy'"),
        ("float32: standard=ulp rtol=1", "rtol/atol apply to the allclose standard only"),
        ("float32:", "no standard, rtol or atol"),
    ],
)
def test_parse_tolerances_rejects_bad_lines(line: str, problem: str) -> None:
    with pytest.raises(PrecisionInputError, match=r"precision_tolerances line 1 \(.*\): ") as info:
        parse_tolerances([line])
    assert problem in str(info.value)


def test_failure_lists_environment_differences(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _record(tmp_path, out=_value())
    current = _sources.environment_record()
    monkeypatch.setattr(
        "pytest_precision.golden._golden.environment_record",
        lambda device=None, seed=None: {
            **current,
            "torch": "9.9.9",
            "env.HCCL_DETERMINISTIC": "TRUE",
        },
    )
    with pytest.raises(AssertionError) as info:
        Golden(tmp_path, TEST_ID)(_value(1.1), "out")
    message = str(info.value)
    assert "environment differs from the run that recorded the golden:" in message
    torch_line = f"  torch: {torch.__version__} (golden) vs 9.9.9 (now)  [library versions]"
    env_line = "  env.HCCL_DETERMINISTIC: - (golden) vs TRUE (now)  [environment variables]"
    assert torch_line in message
    assert env_line in message
    assert message.index(torch_line) < message.index(env_line)  # likely culprit first
    assert "python:" not in message


def test_environment_fingerprint_is_recorded(tmp_path: Path) -> None:
    environment = read_golden(_record(tmp_path, out=_value())).environment
    assert environment["torch"] == torch.__version__
    assert environment["device"] == "cpu"
    assert environment["determinism.deterministic_algorithms"] in ("True", "False")


def test_seed_is_recorded_only_when_the_test_seeded(tmp_path: Path) -> None:
    """An unseeded torch seed is random: recording it made every checklist list the seed."""
    unseeded = Golden(tmp_path, TEST_ID, update=True)
    unseeded(_value(), "out")
    assert "seed" not in read_golden(unseeded.location).environment
    seeded = Golden(tmp_path / "seeded", TEST_ID, update=True, seed=1234)
    seeded(_value(), "out")
    assert read_golden(seeded.location).environment["seed"] == "1234"


def test_load_returns_the_stored_value(tmp_path: Path) -> None:
    _record(tmp_path, out={"x": _value()})
    assert Golden(tmp_path, TEST_ID).load("out")["x"].equal(_value())
    with pytest.raises(PrecisionError, match="no golden named 'nope'"):
        Golden(tmp_path, TEST_ID).load("nope")


def test_assert_close_to_golden_outside_a_test_is_a_clear_error() -> None:
    token = activate(None)
    try:
        with pytest.raises(PrecisionError, match="runs inside a pytest test"):
            assert_close_to_golden(torch.ones(1))
    finally:
        deactivate(token)


# --- a dump serving as goldens -------------------------------------------------------------------


def _tensor_record(name: str, slot: str, value: torch.Tensor, module: str | None) -> Record:
    return Record(
        name=name,
        slot=slot,
        kind="module" if name.startswith("Module.") else "api",
        op="forward",
        module=module,
        dtype=str(value.dtype).removeprefix("torch."),
        shape=tuple(value.shape),
        loader=lambda: value,
    )


def _fake_dump(path: Path) -> Dump:
    layer = "Module.model.layers.0.Linear.forward.0"
    return Dump(
        path=path,
        format="native",
        records=[
            _tensor_record(layer, "input.0", torch.zeros(2), "model.layers.0"),
            _tensor_record(layer, "output.0", _value(), "model.layers.0"),
            _tensor_record("Functional.matmul.0.forward", "output.0", torch.ones(3), None),
            _tensor_record("Functional.split.0.forward", "output.0", torch.ones(1), None),
            _tensor_record("Functional.split.0.forward", "output.1", torch.zeros(1), None),
            _tensor_record("Module.model.layers.0.Linear.forward.1", "output.0", -_value(), "x"),
            Record(
                name="Functional.stat.0.forward",
                slot="output.0",
                kind="api",
                op="x",
                dtype="float32",
                shape=(1,),
            ),
        ],
        environment={"torch": "0.0-baseline"},
    )


@pytest.fixture
def dump_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "gpu-dump"
    path.mkdir()
    (path / "manifest.json").write_text("{}")
    monkeypatch.setattr(pytest_precision.dump, "load_dump", _fake_dump, raising=False)
    return path


def test_dump_records_serve_as_goldens(dump_dir: Path) -> None:
    golden = Golden(dump_dir, TEST_ID)
    golden(_value(), "Module.model.layers.0.Linear.forward.0.output.0")
    golden(_value(), "Module.model.layers.0.Linear.forward.0")
    golden(_value(), "model.layers.0")  # a module path: its first call's output
    golden((torch.ones(1), torch.zeros(1)), "Functional.split.0.forward")
    assert golden.records[2]["golden"] == (
        f"{dump_dir} record Module.model.layers.0.Linear.forward.0.output.0"
    )
    with pytest.raises(AssertionError, match="golden mismatch"):
        golden(torch.zeros(3), "Functional.matmul.0.forward")


def test_dump_lookup_failures_are_clear(dump_dir: Path) -> None:
    golden = Golden(dump_dir, TEST_ID)
    with pytest.raises(AssertionError, match=r"no record or module named 'model\.nope'"):
        golden(_value(), "model.nope")
    with pytest.raises(PrecisionInputError, match="statistics only"):
        golden(torch.ones(1), "Functional.stat.0.forward")
    with pytest.raises(PrecisionError, match=r"cannot write into .*it is a dump"):
        Golden(dump_dir, TEST_ID, update=True)


def test_dump_environment_differences_are_listed(dump_dir: Path) -> None:
    with pytest.raises(AssertionError, match=r"torch: 0.0-baseline \(golden\) vs"):
        Golden(dump_dir, TEST_ID)(torch.zeros(3), "Functional.matmul.0.forward")


def test_unmarked_folder_that_is_no_dump_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "notes.txt").write_text("x")

    def no_dump(path: Path) -> Dump:
        raise DumpFormatError(path, "no manifest.json or dump.json")

    monkeypatch.setattr(pytest_precision.dump, "load_dump", no_dump, raising=False)
    with pytest.raises(PrecisionError, match=r"neither a golden directory .* nor a readable dump"):
        Golden(tmp_path, TEST_ID)


def test_threads_started_by_a_test_use_its_golden(tmp_path: Path) -> None:
    golden = Golden(tmp_path, TEST_ID, update=True)
    token = activate(lambda: golden)
    try:
        thread = threading.Thread(target=assert_close_to_golden, args=(torch.ones(2), "t"))
        thread.start()
        thread.join()
    finally:
        deactivate(token)
    assert [r["name"] for r in golden.records] == ["t"]


def test_the_device_of_a_dump_golden_comes_from_its_manifest() -> None:
    """A dump's manifest lists the machine's devices; the checklist names the one it had
    instead of printing 'device: - (golden)' (#14)."""
    from pytest_precision.golden._sources import recorded_device

    cuda = {
        "devices.cpu.available": "True",
        "devices.cuda.available": "True",
        "devices.cuda.device_name": "NVIDIA H100",
    }
    assert recorded_device(cuda) == "cuda (NVIDIA H100)"
    assert (
        recorded_device({"devices.cpu.available": "True", "devices.cuda.available": "False"})
        == "cpu"
    )
    assert recorded_device({"device": "npu"}) == "npu"
