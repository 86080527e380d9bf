"""The float64 mode of the goldens' rerun: computation deepened, data as written, and what
the rerun's values become (references, or the model-level rule when it cannot stand in)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pytest_precision import Golden
from pytest_precision.golden._files import read_golden
from pytest_precision.golden._float64_mode import float64_mode, is_deepened
from pytest_precision.golden._layout import mark_golden_dir

BF16 = torch.bfloat16


def _bf16(seed: int, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(BF16)


def test_ops_on_low_precision_run_in_float64_and_match_a_float64_computation() -> None:
    x, w = _bf16(0, 8, 16), _bf16(1, 4, 16)
    with float64_mode() as mode:
        y = torch.nn.functional.linear(x, w).softmax(-1, dtype=torch.float32).sum(0)
    expected = torch.nn.functional.linear(x.double(), w.double()).softmax(-1).sum(0)
    assert y.dtype == torch.float64
    assert is_deepened(y)
    assert torch.equal(y, expected)
    assert mode.deepened_ops == 3
    normal = torch.nn.functional.linear(x, w).softmax(-1, dtype=torch.float32).sum(0)
    assert not torch.equal(normal.double(), expected)  # the normal run rounds


@pytest.mark.parametrize(
    "cast",
    [
        lambda t: t.to(BF16),
        lambda t: t.to("cpu", torch.float16),
        lambda t: t.to(dtype=torch.float32),
        lambda t: t.to(torch.zeros(1, dtype=BF16)),
        lambda t: t.half(),
        lambda t: t.bfloat16(),
        lambda t: t.float(),
        lambda t: t.type(torch.float16),
        lambda t: t.type("torch.HalfTensor"),
        lambda t: t.type_as(torch.zeros(1, dtype=BF16)),
    ],
    ids=["to", "to_device_dtype", "to_kw", "to_other", "half", "bfloat16", "float", "type",
         "type_str", "type_as"],
)  # fmt: skip
def test_casts_of_deepened_values_are_identities(cast) -> None:
    with float64_mode():
        y = _bf16(0, 16) * 3.3
        cast_y = cast(y)
    assert cast_y.dtype == torch.float64
    assert torch.equal(cast_y, y)
    assert is_deepened(cast_y)


def test_data_is_made_as_written_creation_and_casts_of_unrounded_data() -> None:
    torch.manual_seed(5)
    normal = (torch.randn(8, dtype=BF16), torch.randn(8).to(BF16), torch.nn.Linear(8, 4))
    torch.manual_seed(5)
    with float64_mode():
        shadow = (torch.randn(8, dtype=BF16), torch.randn(8).to(BF16), torch.nn.Linear(8, 4))
        module = shadow[2].to(BF16)
    assert shadow[0].dtype == BF16
    assert torch.equal(shadow[0], normal[0])
    assert shadow[1].dtype == BF16
    assert torch.equal(shadow[1], normal[1])
    assert torch.equal(shadow[2].weight, normal[2].weight.to(BF16))
    assert module.weight.dtype == BF16
    assert not is_deepened(module.weight)


def test_integer_and_float32_only_ops_are_untouched() -> None:
    ids = torch.arange(12).reshape(3, 4)
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))
    with float64_mode() as mode:
        cumsum, doubled, mask = ids.cumsum(-1), ids * 2, ids > 3
        f32 = (x @ x.T).exp()
    assert (cumsum.dtype, doubled.dtype, mask.dtype) == (torch.int64, torch.int64, torch.bool)
    assert torch.equal(cumsum, ids.cumsum(-1))
    assert torch.equal(doubled, ids * 2)
    assert f32.dtype == torch.float32
    assert torch.equal(f32, (x @ x.T).exp())
    assert not is_deepened(f32)
    assert mode.deepened_ops == 0


def test_in_place_writes_keep_their_target_and_views_alias() -> None:
    cache = torch.zeros(2, 4, dtype=BF16)
    with float64_mode():
        cache[0] = _bf16(0, 4) * 1.5  # a bf16 buffer keeps bf16, as in the normal run
        cache[1].copy_(_bf16(1, 4))  # a view of a buffer that is not deepened aliases it
        deep = _bf16(2, 4) * 2
        deep.add_(_bf16(3, 4))  # in place on a deepened value: float64 still
    assert cache.dtype == BF16
    assert torch.equal(cache[1], _bf16(1, 4))
    assert torch.equal(cache[0], (_bf16(0, 4).double() * 1.5).to(BF16))
    assert deep.dtype == torch.float64
    assert torch.equal(deep, _bf16(2, 4).double() * 2 + _bf16(3, 4).double())


def test_autocast_float32_is_low_precision_and_deepened_ops_run_without_it() -> None:
    a = torch.randn(8, 8, generator=torch.Generator().manual_seed(0))
    with torch.autocast("cpu", dtype=BF16), float64_mode():
        out = a @ a
    assert out.dtype == torch.float64
    assert torch.equal(out, a.double() @ a.double())


# -- the rerun's values as goldens' envelopes ---------------------------------------------------


@pytest.fixture
def gdir(tmp_path: Path) -> Path:
    mark_golden_dir(tmp_path)
    return tmp_path


def _body(
    golden: Golden, *, shape: int = 16, extra: bool = False, fail: bool = False, seed: int = 0
) -> None:
    x, w = _bf16(seed, 4, 16), _bf16(1, shape, 16)
    golden(torch.nn.functional.linear(x, w).relu() @ _bf16(2, shape, shape), "deep")
    golden(x, "data")  # created, no op: judged as data
    if extra:
        golden(x * 2, "extra")
    if fail:
        raise ValueError("the rerun met float64")


def _recorded(gdir: Path, rerun: dict, **first: bool) -> tuple[dict, list[dict]]:
    golden = Golden(gdir, "t", update=True, autoflush=False, float64_rerun=True)
    _body(golden, **first)
    assert golden.awaits_float64_rerun
    run = golden.begin_float64_rerun()
    error = None
    try:
        with run.mode:
            _body(golden, **rerun)
    except ValueError as exc:
        error = exc
    golden.end_float64_rerun(error)
    golden.flush(complete=True)
    entries = read_golden(gdir / "t.safetensors").entries
    return {name: e.envelope for name, e in entries.items()}, golden.records


def test_a_matching_rerun_stores_float64_references(gdir: Path) -> None:
    envelopes, records = _recorded(gdir, {})
    assert envelopes["deep"]["kind"] == "reference"
    assert envelopes["data"] is None
    reference = read_golden(gdir / "t.safetensors").entries["deep"].references["deep"]
    x, w = _bf16(0, 4, 16).double(), _bf16(1, 16, 16).double()
    exact = torch.nn.functional.linear(x, w).relu() @ _bf16(2, 16, 16).double()
    assert torch.equal(reference, exact.float())  # bf16 goldens keep a float32 reference
    assert [r["status"] for r in records] == ["recorded", "recorded"]
    assert "float64 reference from the test's float64 rerun" in records[0]["message"]
    assert "no op rounded it" in records[1]["message"]


@pytest.mark.parametrize(
    ("rerun", "why"),
    [
        ({"shape": 8}, "its float64 rerun gave deep the shape (4, 8), not (4, 16)"),
        ({"extra": True}, "its float64 rerun asserted 3 golden(s) (deep, data, extra) where the "
         "test asserted 2 (deep, data)"),
        ({"fail": True}, "its float64 rerun raised ValueError: the rerun met float64"),
        ({"seed": 9}, "u RMS away from the test's (beyond the 32u any honest rounding reaches: "
         "another computation, such as unseeded random inputs)"),
    ],
    ids=["shape", "calls", "raised", "other-inputs"],
)  # fmt: skip
def test_a_rerun_that_cannot_stand_in_gives_the_model_rule_and_says_why(
    gdir: Path, rerun: dict, why: str
) -> None:
    envelopes, records = _recorded(gdir, rerun)
    assert envelopes["deep"]["kind"] == "model"
    assert why in envelopes["deep"]["measured_from"]
    # a test-level problem leaves every low-precision value unvouched for; a value-level one
    # only that value
    test_level = "asserted" in why or "raised" in why
    assert (envelopes["data"] or {}).get("kind") == ("model" if test_level else None)
    assert why in records[0]["message"]
    assert "for a sharper check pass reference=" in records[0]["message"]


def test_a_test_that_did_not_pass_is_not_rerun(gdir: Path) -> None:
    golden = Golden(gdir, "t", update=True, autoflush=False, float64_rerun=True)
    _body(golden)
    golden.flush(complete=False)  # the plugin ends the waiting values of a failing test
    envelopes = {n: e.envelope for n, e in read_golden(gdir / "t.safetensors").entries.items()}
    assert envelopes["deep"]["kind"] == "model"
    assert "not rerun" in golden.records[0]["message"]
