"""A dump is untrusted input: the names in it must never run as code (export-test), never make
a rerun call a function that does more than compute (replay, compare's float64 rerun), and
never break a file name (diagnose). The dumps are real captures of a tiny module, edited the way
an attacker (or a careless converter) would."""

from __future__ import annotations

import ast
import errno
import fnmatch
import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_precision import capture, compare_dumps, replay_op
from pytest_precision.diagnosis._workflow import _export
from pytest_precision.replay._export import export_test, name_slug, render_test
from pytest_precision.rerun._allowlist import refusal
from pytest_precision.rerun._arguments import _decoded
from pytest_precision.rerun._ops import NotReplayable

MUL = "Tensor.mul.0.forward"
SOFTMAX = "Functional.softmax.0.forward"

#: Code that would leave a marker file behind if a name ever ran.
PAYLOAD = '"""; __import__("pathlib").Path({marker!r}).touch(); """\\\n\x00\u2028'


class _Model(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.softmax(x * 2, dim=-1)


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tensor capture of two ops: ``Tensor.mul`` then ``Functional.softmax``."""
    path = tmp_path_factory.mktemp("clean") / "dump"
    model = _Model()
    with torch.no_grad(), capture(model, path, level="op"):
        model(torch.linspace(-1, 1, 6).reshape(2, 3))
    return path


def _edited(source: Path, target: Path, edit: Callable[[dict[str, Any]], Any]) -> Path:
    """A copy of the dump ``source`` with ``edit`` applied to each of its records (a record it
    returns False for is dropped)."""
    shutil.copytree(source, target)
    records = target / "rank0" / "records.jsonl"
    rows = [json.loads(line) for line in records.read_text().splitlines()]
    kept = [row for row in rows if edit(row) is not False]
    records.write_text("".join(json.dumps(row) + "\n" for row in kept))
    (target / "rank0" / "rank.json").write_text(
        json.dumps(
            {**json.loads((source / "rank0" / "rank.json").read_text()), "records": len(kept)}
        )
    )
    return target


def _renamed(old: str, new: str) -> Callable[[dict[str, Any]], None]:
    def edit(row: dict[str, Any]) -> None:
        if row["name"] == old:
            row["name"] = new

    return edit


# --- export-test: names are data, never code ---------------------------------------------------


def _crafted_name(marker: Path, length: int = 0) -> str:
    return f"Tensor.mul{PAYLOAD.format(marker=str(marker))}{'x' * length}.0.forward"


def test_an_exported_test_holds_a_crafted_name_as_data(
    clean: Path, tmp_path: Path, pytester: pytest.Pytester
) -> None:
    marker = tmp_path / "PWNED"
    name = _crafted_name(marker)
    dump = _edited(clean, tmp_path / "crafted", _renamed(MUL, name))
    written = export_test(dump, name, pytester.path / "test_crafted.py")
    text = written[0].read_text()
    module = ast.parse(text)
    call = next(node for node in module.body if isinstance(node, ast.Assign))
    assert ast.literal_eval(call.value) == name  # the name, whole, as a literal
    docstring = ast.get_docstring(module) or ""
    assert re.fullmatch(r"[ -~\n]*", docstring)
    assert "\\" not in docstring
    exec(compile(text, "test_crafted.py", "exec"), {})  # importing it runs nothing of the name
    assert not marker.exists()
    result = pytester.runpytest("-p", "no:cacheprovider", "-q")
    result.assert_outcomes(passed=1)  # the mul reruns within float32 rounding
    assert not marker.exists()


def test_an_exported_test_fails_when_the_op_is_wrong(
    clean: Path, tmp_path: Path, pytester: pytest.Pytester
) -> None:
    name = _crafted_name(tmp_path / "PWNED").replace("Tensor.mul", "Functional.softmax")
    dump = _edited(clean, tmp_path / "crafted", _renamed(SOFTMAX, name))
    export_test(dump, name, pytester.path / "test_crafted.py")
    pytester.makeconftest(
        """
        import pytest
        import torch
        import torch.nn.functional as F

        right = F.softmax


        def float32_bug(x, *args, **kwargs):  # wrong in float32, right in float64
            return right(x, *args, **kwargs) * (1.01 if x.dtype == torch.float32 else 1.0)


        @pytest.fixture(autouse=True)
        def _broken_softmax(monkeypatch):  # undone after the test: pytester runs in-process
            monkeypatch.setattr(F, "softmax", float32_bug)
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "-q")
    result.assert_outcomes(failed=1)
    assert "op-bug" in result.stdout.str()


@settings(max_examples=200, deadline=None)
@given(name=st.text(max_size=300), folder=st.text(min_size=1, max_size=40))
def test_any_name_renders_a_valid_test_that_names_only_its_call(name: str, folder: str) -> None:
    text = render_test(
        name, source=folder, file="test_x.py", dump_folder=folder, golden_folder=folder
    )
    module = ast.parse(text)
    docstring = ast.get_docstring(module) or ""
    assert re.fullmatch(r"[ -~\n]*", docstring)
    assert "\\" not in docstring
    assert '"' not in docstring
    assert docstring.count("'") == 2  # the template's own (call's, dtype's)
    values = [n.value for n in module.body if isinstance(n, ast.Assign)]
    assert [ast.literal_eval(v) for v in values] == [name]
    test = next(n for n in module.body if isinstance(n, ast.FunctionDef))
    assert re.fullmatch(r"test_[0-9a-z_]{0,64}", test.name)
    marker = test.decorator_list[0]
    assert isinstance(marker, ast.Call)
    assert ast.literal_eval(marker.args[0]) == folder
    keywords = {k.arg: ast.literal_eval(k.value) for k in marker.keywords}
    assert keywords["golden"] == folder
    assert fnmatch.fnmatchcase(name, keywords["ops"])  # the glob matches its call exactly
    assert not fnmatch.fnmatchcase(name + "x", keywords["ops"])


@given(a=st.text(), b=st.text())
def test_unusual_names_shorten_to_distinct_slugs(a: str, b: str) -> None:
    for name in (a, b):
        assert re.fullmatch(r"[0-9a-z_]{0,64}", name_slug(name))
    unusual = [len(n) > 64 or not re.fullmatch(r"[A-Za-z0-9_.]*", n) for n in (a, b)]
    if a != b and all(unusual):
        assert name_slug(a) != name_slug(b)


# --- long names: file names stay short, diagnose never fails on them ----------------------------


def test_a_260_character_name_is_exported_by_diagnose(clean: Path, tmp_path: Path) -> None:
    name = f"Tensor.mul{'x' * 250}.0.forward"
    golden = _edited(clean, tmp_path / "golden", _renamed(MUL, name))
    comparison = compare_dumps(golden, golden)
    steps: list[Any] = []
    divergence = SimpleNamespace(name=name, step=0, rank=0)
    exported = _export(comparison, divergence, tmp_path, steps)
    assert exported is not None, steps
    assert len(exported.name) < 100
    assert exported.exists()
    assert exported.with_name(f"{exported.stem}_dump").is_dir()
    assert exported.with_name(f"{exported.stem}_golden").is_dir()


def test_an_unwritable_export_is_a_step_of_the_diagnosis(
    clean: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(path: Path, data: bytes) -> None:
        raise OSError(errno.ENAMETOOLONG, "File name too long", str(path))

    monkeypatch.setattr("pytest_precision.replay._export.atomic_write", refuse)
    comparison = compare_dumps(clean, clean)
    steps: list[Any] = []
    divergence = SimpleNamespace(name=MUL, step=0, rank=0)
    assert _export(comparison, divergence, tmp_path, steps) is None
    assert "File name too long" in steps[-1].finding
    assert steps[-1].finding.startswith("no test exported:")


# --- rerun: only functions that compute --------------------------------------------------------


def _as_call(name: str, kind: str, op: str, **values: Any) -> Callable[[dict[str, Any]], None]:
    """An edit turning the ``Tensor.mul`` call into ``kind.op``, its non-tensor inputs set."""

    def edit(row: dict[str, Any]) -> None:
        if row["name"] != MUL:
            return
        row.update(name=name, kind=kind, op=op)
        if row["slot"] in values:
            row["value"] = values[row["slot"]]

    return edit


def test_compare_does_not_rerun_a_recorded_save(clean: Path, tmp_path: Path) -> None:
    stolen = tmp_path / "stolen.pt"
    name = "Torch.save.0.forward"
    golden = _edited(
        clean, tmp_path / "golden", _as_call(name, "Torch", "save", **{"input.1": str(stolen)})
    )

    def skewed(row: dict[str, Any]) -> None:  # the target's output differs: compare reruns it
        _as_call(name, "Torch", "save", **{"input.1": str(stolen)})(row)
        if row["name"] == name and row["slot"] == "output.0":
            row["data"]["key"] = "2"

    target = _edited(clean, tmp_path / "target", skewed)
    comparison = compare_dumps(golden, target)
    assert not stolen.exists()
    assert comparison.matched_calls == 2  # compared, the save judged without its rerun
    with pytest.raises(NotReplayable, match=r"not rerun: Torch\.save writes files"):
        replay_op(target, name)
    assert not stolen.exists()


def _denormals_kept() -> bool:
    return float(torch.tensor([1e-40]) * 1.0) != 0.0


@pytest.mark.parametrize(
    ("op", "value", "state", "reason"),
    [
        ("set_flush_denormal", True, _denormals_kept, "changes process-wide state"),
        ("set_num_threads", 2, torch.get_num_threads, "changes process-wide state"),
        ("manual_seed", 7, torch.initial_seed, "touches the random number generator state"),
        (
            "use_deterministic_algorithms",
            True,
            torch.are_deterministic_algorithms_enabled,
            "changes process-wide state",
        ),
    ],
)
def test_replay_leaves_process_state_alone(
    clean: Path, tmp_path: Path, op: str, value: Any, state: Callable[[], Any], reason: str
) -> None:
    name = f"Torch.{op}.0.forward"

    def edit(row: dict[str, Any]) -> bool:  # the call becomes torch.<op>(value)
        if row["name"] == MUL and row["slot"] == "input.1":
            return False
        if row["name"] == MUL and row["slot"] == "input.0":
            row.update(dtype=None, shape=None, stats=None, data=None, value=value)
        _as_call(name, "Torch", op)(row)
        return True

    dump = _edited(clean, tmp_path / "crafted", edit)
    before = state()
    with pytest.raises(NotReplayable, match=rf"not rerun: Torch\.{op} {reason}"):
        replay_op(dump, name)
    assert state() == before


@pytest.mark.parametrize(
    ("kind", "op", "reason"),
    [
        ("Torch", "save", "writes files"),
        ("Torch", "load", "reads files"),
        ("Torch", "from_file", "reads files"),
        ("Aten", "from_file.default", "reads files"),
        ("Aten", "save.default", "writes files"),
        ("Aten", "_print.default", "returns nothing"),
        ("Aten", "_cufft_set_plan_cache_max_size.default", "returns nothing"),
        ("Aten", "manual_seed", "random number generator"),
        ("Aten", "_standard_gamma.default", "random number generator"),
        ("Torch", "get_rng_state", "random number generator"),
        ("Torch", "set_default_dtype", "process-wide state"),
        ("Torch", "compile", "not a computation"),
        ("Torch", "typename", "not a computation in torch's operator registry"),
        ("Tensor", "share_memory_", "memory outside the rerun"),
        ("Tensor", "untyped_storage", "memory outside the rerun"),
        ("Tensor", "set_", "beyond its tensors"),
        ("Tensor", "register_hook", "not a computation"),
        ("Tensor", "__reduce_ex__", "dunder"),
        ("Tensor", "_make_subclass", "private"),
        ("Functional", "handle_torch_function", "not a computation"),
        ("Functional", "boolean_dispatch", "not a computation"),
        ("VF", "__dict__", "dunder"),
        ("NPU", "set_device", "process-wide state"),
        ("NPU", "npu_set_device", "process-wide state"),
        ("Torch", "npu_manual_seed", "random number generator"),
    ],
)
def test_functions_that_do_more_than_compute_are_refused(kind: str, op: str, reason: str) -> None:
    found = refusal(kind, op)
    assert found is not None
    assert reason in found


@pytest.mark.parametrize(
    ("kind", "op"),
    [
        ("Aten", "add.Tensor"),
        ("Aten", "_softmax.default"),
        ("Aten", "native_dropout.default"),
        ("Torch", "matmul"),
        ("Torch", "einsum"),
        ("Torch", "_grouped_mm"),
        ("Torch", "linalg_vector_norm"),
        ("Torch", "rrelu"),
        ("Tensor", "__iadd__"),
        ("Tensor", "__getitem__"),
        ("Tensor", "float"),
        ("Tensor", "cuda"),
        ("Tensor", "T"),
        ("Tensor", "masked_fill_"),
        ("Functional", "linear"),
        ("Functional", "rms_norm"),
        ("Functional", "scaled_dot_product_attention"),
        ("VF", "lstm"),
        ("NPU", "npu_rms_norm"),
    ],
)
def test_computations_capture_records_rerun(kind: str, op: str) -> None:
    assert refusal(kind, op) is None


def test_recorded_torch_names_decode_only_to_dtypes_and_layouts() -> None:
    assert _decoded("torch.float16") is torch.float16
    assert _decoded(["torch.channels_last", "torch.strided"]) == [
        torch.channels_last,
        torch.strided,
    ]
    for text in ("torch.save", "torch.load", "torch.set_flush_denormal", "torch.ops", "torch._C"):
        assert _decoded(text) == text  # stays a string: no callable reaches the op
