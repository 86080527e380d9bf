"""seed_all, its exact restore, dropout removal, and the run-twice check."""

from __future__ import annotations

import functools
import math
import os
import random
import re
import warnings
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from _fakes import FakeAccelerator, install_fake_cuda, install_fake_npu
from _state import changed, global_state
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from pytest_precision import (
    DeterminismWarning,
    PrecisionInputError,
    assert_deterministic,
    seed_all,
)
from pytest_precision.runtime._determinism import DROPOUT_FUNCTIONS
from pytest_precision.runtime._seeds import derive_seed

ASCEND_ENV = {
    "HCCL_DETERMINISTIC": "TRUE",
    "LCCL_DETERMINISTIC": "1",
    "CLOSE_MATMUL_K_SHIFT": "1",
    "ATB_LLM_LCOC_ENABLE": "0",
}


def draws() -> tuple[float, float, list[float]]:
    return random.random(), float(np.random.rand()), torch.rand(3).tolist()


# --- seeding and restore --------------------------------------------------------------------


def test_same_seed_repeats_every_generator_and_another_seed_does_not() -> None:
    with seed_all(5):
        first = draws()
    with seed_all(5):
        again = draws()
    with seed_all(6):
        other = draws()
    assert again == first
    assert all(a != b for a, b in zip(other, first, strict=True))


@pytest.mark.parametrize("deterministic", [True, False])
@pytest.mark.parametrize("remove_dropout", [True, False])
def test_restore_puts_back_every_state(
    monkeypatch: pytest.MonkeyPatch, deterministic: bool, remove_dropout: bool
) -> None:
    # Start from non-default values, so that "restored" cannot mean "reset to defaults".
    monkeypatch.setenv("HCCL_DETERMINISTIC", "false")
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    random.random()
    np.random.rand()
    before = global_state()

    handle = seed_all(99, deterministic=deterministic, remove_dropout=remove_dropout)
    during = changed(before, global_state())
    handle.restore()

    assert {"random", "numpy", "torch cpu rng"} <= set(during)
    assert ("env HCCL_DETERMINISTIC" in during) is deterministic
    assert ("flag deterministic_algorithms" in during) is deterministic
    assert ("F.dropout" in during) is remove_dropout
    assert changed(before, global_state()) == []
    assert not handle.active


def test_torch_flags_go_back_to_warn_only_mode() -> None:
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        before = global_state()
        with seed_all(1):
            assert not torch.is_deterministic_algorithms_warn_only_enabled()
        assert changed(before, global_state()) == []
    finally:
        torch.use_deterministic_algorithms(False)


def test_deterministic_mode_sets_every_flag_and_variable() -> None:
    with seed_all(1, deterministic=True):
        assert torch.are_deterministic_algorithms_enabled()
        assert torch.backends.cudnn.deterministic
        assert not torch.backends.cudnn.benchmark
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
        assert {name: os.environ[name] for name in ASCEND_ENV} == ASCEND_ENV


def test_context_manager_restores_when_the_block_raises() -> None:
    before = global_state()
    with pytest.raises(KeyError), seed_all(3):
        raise KeyError("boom")
    assert changed(before, global_state()) == []


def test_nested_handles_restore_innermost_first_and_restore_is_idempotent() -> None:
    before = global_state()
    outer = seed_all(1, deterministic=False)
    between = global_state()
    inner = seed_all(2)
    inner.restore()
    inner.restore()
    assert changed(between, global_state()) == []
    outer.restore()
    assert changed(before, global_state()) == []


@pytest.mark.parametrize("seed", [-1, 2**32, 1.5, True, "7"])
def test_bad_seed_is_rejected(seed: Any) -> None:
    with pytest.raises(PrecisionInputError, match="seed must be an int"):
        seed_all(seed)


def test_derive_seed_is_stable_and_depends_on_both_inputs() -> None:
    # A literal: hash() would change with PYTHONHASHSEED, i.e. from one process to the next.
    assert derive_seed(1234, "tests/test_x.py::test_a") == 1879065613
    assert derive_seed(1234, "tests/test_x.py::test_b") != derive_seed(
        1234, "tests/test_x.py::test_a"
    )
    assert derive_seed(1235, "tests/test_x.py::test_a") != derive_seed(
        1234, "tests/test_x.py::test_a"
    )


# --- dropout removal ------------------------------------------------------------------------

DROPOUT_MODULES = [
    (nn.Dropout(0.5), (4, 8)),
    (nn.Dropout1d(0.5), (4, 8, 5)),
    (nn.Dropout2d(0.5), (4, 8, 5, 5)),
    (nn.Dropout3d(0.5), (4, 8, 3, 3, 3)),
    (nn.AlphaDropout(0.5), (4, 8)),
    (nn.FeatureAlphaDropout(0.5), (4, 8, 5)),
]


@pytest.mark.parametrize(
    ("module", "shape"),
    DROPOUT_MODULES,
    ids=[type(module).__name__ for module, _ in DROPOUT_MODULES],
)
def test_dropout_modules_in_training_mode_become_the_identity(
    module: nn.Module, shape: tuple[int, ...]
) -> None:
    module.train()
    x = torch.randn(shape)
    assert not torch.equal(module(x), x)  # the control: dropout really drops without seed_all
    with seed_all(1):
        assert torch.equal(module(x), x)
        assert torch.equal(module(x.clone()), x)


@pytest.mark.parametrize("name", DROPOUT_FUNCTIONS)
def test_dropout_functions_become_the_identity_and_come_back(name: str) -> None:
    original = getattr(F, name)
    x = torch.randn(4, 8, 3, 3, 3)
    with seed_all(1):
        assert getattr(F, name) is not original
        assert getattr(F, name)(x, 0.5, True) is x
    assert getattr(F, name) is original


def test_attention_dropout_is_switched_off_positionally_and_by_keyword() -> None:
    original = F.scaled_dot_product_attention
    q, k, v = torch.randn(3, 2, 4, 6, 8)
    exact = original(q, k, v)
    assert not torch.equal(original(q, k, v, dropout_p=0.5), exact)
    with seed_all(1):
        assert torch.equal(F.scaled_dot_product_attention(q, k, v, dropout_p=0.5), exact)
        assert torch.equal(F.scaled_dot_product_attention(q, k, v, None, 0.5), exact)
        assert torch.equal(F.scaled_dot_product_attention(q, k, v), exact)
    assert F.scaled_dot_product_attention is original


def test_multihead_attention_dropout_is_removed_too() -> None:
    attention = nn.MultiheadAttention(8, 2, dropout=0.5, batch_first=True).train()
    x = torch.randn(2, 5, 8)
    with seed_all(1):
        first = attention(x, x, x)[0]
        assert torch.equal(attention(x, x, x)[0], first)


# --- warnings -------------------------------------------------------------------------------


def test_no_warning_where_every_setting_takes_effect() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        seed_all(1).restore()


def test_cublas_setting_after_cuda_init_warns_and_says_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    install_fake_cuda(monkeypatch, FakeAccelerator(initialized=True))
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    with pytest.warns(DeterminismWarning, match="CUBLAS_WORKSPACE_CONFIG.*already initialized"):
        handle = seed_all(1)
    handle.restore()
    assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ


def test_no_warning_when_the_late_variable_already_has_the_value(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    install_fake_cuda(monkeypatch, FakeAccelerator(initialized=True))
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        seed_all(1).restore()


# --- accelerators through fakes (no device runs) --------------------------------------------


def test_fake_npu_is_seeded_configured_and_restored(monkeypatch: pytest.MonkeyPatch) -> None:
    npu = FakeAccelerator(count=2)
    install_fake_npu(monkeypatch, npu)
    for name in ASCEND_ENV:
        monkeypatch.delenv(name, raising=False)

    with seed_all(42):
        assert torch.npu.calls == [("manual_seed_all", 42)]
        assert {name: os.environ.get(name) for name in ASCEND_ENV} == ASCEND_ENV

    assert npu.calls[-1] == ("set_rng_state_all", ["initial state 0", "initial state 1"])
    assert npu.states == ["initial state 0", "initial state 1"]
    assert all(name not in os.environ for name in ASCEND_ENV)


def test_hccl_after_distributed_init_warns(monkeypatch: pytest.MonkeyPatch) -> None:
    install_fake_npu(monkeypatch, FakeAccelerator())
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.delenv("HCCL_DETERMINISTIC", raising=False)
    with pytest.warns(DeterminismWarning) as record:
        seed_all(1).restore()
    messages = sorted(str(warning.message) for warning in record)
    assert [message.split(" cannot take effect:")[0] for message in messages] == [
        "HCCL_DETERMINISTIC=TRUE",
        "LCCL_DETERMINISTIC=1",
    ]
    assert "torch.distributed is already initialized" in messages[0]


# --- assert_deterministic -------------------------------------------------------------------


class TinyBlock(nn.Module):
    """Attention + MLP with dropout everywhere, returning a nested structure like HF models."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, width)
        self.layer = nn.TransformerEncoderLayer(width, 2, 32, dropout=0.3, batch_first=True)
        self.head = nn.Linear(width, 50)

    def forward(self, tokens: torch.Tensor) -> dict[str, Any]:
        hidden = self.layer(self.embed(tokens))
        return {"logits": self.head(hidden), "hidden": (hidden, hidden.argmax(-1)), "n": 2}


class Noisy(nn.Module):
    """Adds 1e-5 relative noise from a private generator, as a racy kernel would."""

    def __init__(self) -> None:
        super().__init__()
        self.generator = torch.Generator().manual_seed(0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * (1 + 1e-5 * torch.randn(x.shape, generator=self.generator))


def chunked_sum(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Sum the columns of ``x`` chunk by chunk, in an order that changes on every call."""
    chunks = x.split(7, dim=1)
    total = torch.zeros(x.shape[0])
    for index in torch.randperm(len(chunks), generator=generator).tolist():
        total = total + chunks[index].sum(dim=1)
    return total


def test_passes_a_deterministic_model_with_active_dropout() -> None:
    torch.manual_seed(0)
    model = TinyBlock().train()
    assert_deterministic(model, torch.randint(0, 50, (2, 6)))


def test_catches_tiny_noise_and_says_where() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), Noisy(), nn.Linear(8, 4))
    with pytest.raises(AssertionError) as excinfo:
        assert_deterministic(model, torch.randn(3, 8), runs=3, seed=5)
    message = str(excinfo.value)
    assert message.startswith(
        "Sequential is not deterministic: run 2 of 3 differs from run 1 "
        "(seed 5, deterministic algorithms on)"
    )
    assert re.search(
        r"\n  output: \d+ of 12 elements differ \(torch.float32, shape \(3, 4\)\); "
        r"first at index \(\d, \d\): run 1 = \S+ \(bits 0x\w{8}\), run 2 = \S+ \(bits 0x\w{8}\)$",
        message,
    )


def test_catches_last_bit_differences_from_summation_order() -> None:
    x = torch.randn(64, 700, generator=torch.Generator().manual_seed(1))
    generator = torch.Generator().manual_seed(0)
    first, second = chunked_sum(x, generator), chunked_sum(x, generator)
    # The premise: the two orders disagree only in the last bits.
    assert not torch.equal(first, second)
    assert torch.allclose(first, second, rtol=1e-5, atol=1e-5)

    with pytest.raises(AssertionError, match=r"output: \d+ of 64 elements differ") as excinfo:
        assert_deterministic(chunked_sum, x, generator)
    assert "first at index (" in str(excinfo.value)


def test_names_the_first_module_whose_output_changed() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Sequential(nn.ReLU(), Noisy()), nn.Linear(8, 4))
    with pytest.raises(
        AssertionError, match=r"first module whose output differed: '1\.1' \(Noisy\), call 1"
    ):
        assert_deterministic(model, torch.randn(3, 8), locate=model)


def test_a_difference_outside_the_modules_is_said_to_be_outside() -> None:
    torch.manual_seed(0)
    model = nn.Linear(4, 4)
    noise = Noisy()

    def generate(x: torch.Tensor) -> torch.Tensor:
        return noise(model(x).detach())

    with pytest.raises(AssertionError, match="difference arose outside the model's modules"):
        assert_deterministic(generate, torch.randn(2, 4), locate=model)


def test_reports_each_differing_item_by_path() -> None:
    calls = iter(range(100))

    def fn() -> dict[str, Any]:
        n = next(calls)
        return {"same": torch.ones(2), "items": [torch.ones(3), torch.full((3,), float(n))], "n": n}

    with pytest.raises(AssertionError) as excinfo:
        assert_deterministic(fn)
    lines = str(excinfo.value).splitlines()[1:]
    assert lines == [
        "  ['items'][1]: 3 of 3 elements differ (torch.float32, shape (3,)); first at index (0,): "
        "run 1 = 0.0 (bits 0x00000000), run 2 = 1.0 (bits 0x3f800000)",
        "  ['n']: run 1 = 0, run 2 = 1",
    ]


def test_structure_changes_are_reported() -> None:
    lengths = iter([1, 2])

    def fn() -> list[torch.Tensor]:
        return [torch.zeros(1)] * next(lengths)

    with pytest.raises(
        AssertionError,
        match=r"structure differs: run 1 has items \[\[0\]\], run 2 has \[\[0\], \[1\]\]",
    ):
        assert_deterministic(fn, runs=2)


def test_comparison_is_bitwise_for_nan_and_signed_zero() -> None:
    constant = torch.tensor([float("nan"), 1.0])
    assert_deterministic(lambda: (constant.clone(), float("nan"), np.array([np.nan])))
    signs = iter([0.0, -0.0])
    with pytest.raises(AssertionError, match=r"output: run 1 = 0\.0, run 2 = -0\.0"):
        assert_deterministic(lambda: next(signs), runs=2)


def test_numpy_integer_and_bool_outputs_are_compared() -> None:
    counter = iter(range(10))
    with pytest.raises(
        AssertionError, match=r"\[1\]: 1 of 4 elements differ \(int64.*run 1 = 0, run 2 = 1"
    ):
        assert_deterministic(lambda: (np.ones(2, dtype=bool), np.array([next(counter), 0, 0, 0])))


def test_outputs_are_copied_so_a_reused_buffer_cannot_hide_a_difference() -> None:
    buffer = torch.zeros(3)
    values = iter([1.0, 2.0])

    def fn() -> torch.Tensor:
        buffer.fill_(next(values))
        return buffer

    with pytest.raises(AssertionError, match="3 of 3 elements differ"):
        assert_deterministic(fn, runs=2)


def test_arguments_are_forwarded_and_seeds_restored() -> None:
    before = global_state()
    assert_deterministic(functools.partial(torch.randn, 3), 4, dtype=torch.float64)
    assert changed(before, global_state()) == []


def test_runs_below_two_and_a_non_module_locate_are_input_errors() -> None:
    with pytest.raises(PrecisionInputError, match="runs >= 2"):
        assert_deterministic(torch.zeros, 1, runs=1)
    with pytest.raises(PrecisionInputError, match=r"locate must be a torch\.nn\.Module"):
        assert_deterministic(torch.zeros, 1, locate="model")  # type: ignore[arg-type]


@settings(max_examples=30, deadline=None)
@given(
    shapes=st.lists(st.lists(st.integers(1, 4), min_size=0, max_size=3), min_size=1, max_size=4),
    data=st.data(),
)
def test_a_one_ulp_change_anywhere_is_caught_at_its_path_and_index(
    shapes: list[list[int]], data: st.DataObject
) -> None:
    outputs = {f"out{i}": torch.randn(shape) for i, shape in enumerate(shapes)}
    item = data.draw(st.sampled_from(sorted(outputs)))
    flat = data.draw(st.integers(0, outputs[item].numel() - 1))
    changed_outputs = {name: t.clone() for name, t in outputs.items()}
    target = changed_outputs[item].view(-1)
    target[flat] = torch.nextafter(target[flat], torch.tensor(math.inf))
    results = iter([outputs, changed_outputs])

    with pytest.raises(AssertionError) as excinfo:
        assert_deterministic(lambda: next(results), runs=2)
    index = tuple(int(i) for i in np.unravel_index(flat, tuple(outputs[item].shape)))
    assert (
        str(excinfo.value)
        .splitlines()[1]
        .startswith(
            f"  ['{item}']: 1 of {outputs[item].numel()} elements differ (torch.float32, "
            f"shape {tuple(outputs[item].shape)}); first at index {index}: "
        )
    )


# --- found in review -------------------------------------------------------------------------


def test_numpy_scalars_and_complex_numbers_compare_bit_by_bit() -> None:
    assert_deterministic(lambda: (np.float32("nan"), complex(math.nan, 0.0)))
    signs = iter([0.0, -0.0, -0.0])
    with pytest.raises(AssertionError, match=r"1 of 1 elements differ"):
        assert_deterministic(lambda: np.float32(next(signs)))
    zeros = iter([complex(0.0, 0.0), complex(-0.0, 0.0), complex(-0.0, 0.0)])
    with pytest.raises(AssertionError, match="differ"):
        assert_deterministic(lambda: next(zeros))


def test_values_that_cannot_be_compared_are_input_errors() -> None:
    with pytest.raises(PrecisionInputError, match=r"\[1\]: cannot compare a object between runs"):
        assert_deterministic(lambda: (torch.ones(2), object()))
    with pytest.raises(PrecisionInputError, match="numpy object array"):
        assert_deterministic(lambda: np.array([object()]))


def test_fn_keyword_reaches_the_callee() -> None:
    assert_deterministic(lambda fn: torch.full((2,), float(fn)), fn=3)


class _Cache:
    """Like an HF DynamicCache: an opaque object whose repr holds its address."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor


class _LayerWithCache(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, _Cache]:
        return x * 2, _Cache(x)


class _NoisyTop(torch.nn.Module):
    """Deterministic inside its layer; the top adds a different value on every call."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = _LayerWithCache()
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, _ = self.layer(x)
        self.calls += 1
        return y + 1e-3 * self.calls


def test_locate_ignores_addresses_of_opaque_outputs() -> None:
    model = _NoisyTop()
    with pytest.raises(
        AssertionError, match="first module whose output differed: the model itself"
    ):
        assert_deterministic(lambda: model(torch.ones(3)), locate=model, deterministic=False)


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
def test_dropout_removal_keeps_torchscript_working() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.1))
    with seed_all(1):
        scripted = torch.jit.script(model)
    scripted.eval()
    assert scripted(torch.ones(1, 2)).shape == (1, 2)


def test_an_equally_deterministic_cublas_setting_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
    with seed_all(1):
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"


def test_restoring_an_outer_handle_first_restores_the_inner_one_too() -> None:
    before = global_state()
    outer = seed_all(1)
    inner = seed_all(2)
    outer.restore()
    assert not inner.active
    inner.restore()  # idempotent
    assert changed(before, global_state()) == []
    assert F.dropout is not None
    assert "identity" not in F.dropout.__name__


def test_complex_bits_print_real_part_first() -> None:
    values = iter([1 + 2j, 1 + 3j, 1 + 3j])
    with pytest.raises(AssertionError, match=r"\(1\+2j\) \(bits 0x3f800000 0x40000000\)"):
        assert_deterministic(lambda: torch.tensor([next(values)], dtype=torch.complex64))
