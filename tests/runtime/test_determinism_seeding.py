"""seed_all: seeding every generator, its exact restore, dropout removal, and the warnings and
accelerator settings (through fakes) of deterministic mode."""

from __future__ import annotations

import os
import random
import warnings
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from _fakes import FakeAccelerator, install_fake_cuda, install_fake_npu
from _state import changed, global_state
from torch import nn

from pytest_precision import DeterminismWarning, PrecisionInputError, seed_all
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


# --- found in review -------------------------------------------------------------------------


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
