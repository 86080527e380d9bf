"""The device layer: availability reasons, seeding, synchronization, versions, fingerprints.

Accelerator paths are exercised with recording fakes; nothing here claims an NPU or GPU ran.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from _fakes import FakeAccelerator, FakeTorchNpu, install_fake_cuda, install_fake_npu

from pytest_precision import PrecisionInputError
from pytest_precision.runtime import _devices
from pytest_precision.runtime._devices import (
    TORCH_DEFAULT_SEED,
    available_devices,
    backends,
    environment_fingerprint,
    get_backend,
)

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_registry_holds_cpu_cuda_and_npu() -> None:
    assert [backend.name for backend in backends()] == ["cpu", "cuda", "npu"]
    assert get_backend("npu").name == "npu"


def test_unknown_device_names_the_known_ones() -> None:
    with pytest.raises(PrecisionInputError, match=r"unknown device 'tpu'.*cpu, cuda, npu"):
        get_backend("tpu")


def test_cpu_is_always_available_and_seeds_only_the_cpu_generator() -> None:
    cpu = get_backend("cpu")
    assert cpu.is_available()[0]
    assert cpu in available_devices()
    queued = list(torch.cuda._lazy_seed_tracker.call_order)
    state = cpu.get_rng_state()
    try:
        cpu.seed(7)
        first = torch.rand(4)
        cpu.seed(7)
        assert torch.equal(torch.rand(4), first)
    finally:
        cpu.set_rng_state(state)
    assert torch.equal(torch.get_rng_state(), state)
    # torch.manual_seed would also have queued a CUDA seed; the CPU backend must not.
    assert torch.cuda._lazy_seed_tracker.call_order == queued
    assert cpu.device_name()
    assert cpu.versions() == {"torch": torch.__version__}


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_cuda_unavailable_says_why() -> None:
    available, reason = get_backend("cuda").is_available()
    assert not available
    assert "CUDA" in reason


def test_cuda_hidden_by_visible_devices_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert get_backend("cuda").is_available() == (
        False,
        "no CUDA device is visible (CUDA_VISIBLE_DEVICES='')",
    )


def test_cuda_calls_go_to_torch_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeAccelerator(count=2)
    install_fake_cuda(monkeypatch, fake)
    cuda = get_backend("cuda")
    assert cuda.is_available() == (True, "2 device(s)")
    assert cuda.versions()["cuda"] == "12.4"
    cuda.seed(5)
    cuda.synchronize()
    assert fake.calls == [("manual_seed_all", 5), ("synchronize", 0), ("synchronize", 1)]
    assert cuda.device_name() == "2 x Fake Accelerator 9000"
    assert "CUBLAS_WORKSPACE_CONFIG" in cuda.late_env()


def test_uninitialized_accelerator_is_neither_initialized_nor_synchronized(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = FakeAccelerator(count=1, initialized=False)
    install_fake_cuda(monkeypatch, fake)
    cuda = get_backend("cuda")
    cuda.synchronize()
    assert fake.calls == []
    assert cuda.device_name() == "1 cuda device(s), not initialized yet"
    assert cuda.late_env() == {}


@pytest.mark.parametrize("initialized_meanwhile", [False, True])
def test_uninitialized_accelerator_gets_its_queued_seeds_back(
    monkeypatch: pytest.MonkeyPatch, initialized_meanwhile: bool
) -> None:
    fake = FakeAccelerator(count=2, initialized=False)
    install_fake_cuda(monkeypatch, fake)
    cuda = get_backend("cuda")
    state = cuda.get_rng_state()
    cuda.seed(5)
    assert fake._lazy_seed_tracker.manual_seed_all_cb is not None
    fake.initialized = initialized_meanwhile
    cuda.set_rng_state(state)
    assert fake._lazy_seed_tracker.manual_seed_all_cb is None
    assert fake._lazy_seed_tracker.call_order == []
    if initialized_meanwhile:
        # Nothing was queued before, so the devices go back to torch's unseeded start.
        assert fake.calls[-1] == ("manual_seed_all", TORCH_DEFAULT_SEED)
        assert fake.states == [f"seeded {TORCH_DEFAULT_SEED}"] * 2
    else:
        assert fake.calls == [("manual_seed_all", 5)]
        assert fake.states == ["initial state 0", "initial state 1"]


def test_seed_queued_before_is_replayed_when_initialized_meanwhile(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = FakeAccelerator(count=2, initialized=False)
    install_fake_cuda(monkeypatch, fake)
    fake.manual_seed_all(3)  # the user's own seed, still queued
    cuda = get_backend("cuda")
    state = cuda.get_rng_state()
    cuda.seed(5)
    fake.initialized = True
    cuda.set_rng_state(state)
    assert fake.states == ["seeded 3", "seeded 3"]


@pytest.mark.device
@needs_cuda
def test_real_cuda_seeds_and_restores() -> None:
    cuda = get_backend("cuda")
    torch.zeros(1, device="cuda")  # initialize, so that real states exist
    state = cuda.get_rng_state()
    cuda.seed(3)
    first = torch.rand(4, device="cuda")
    cuda.seed(3)
    assert torch.equal(torch.rand(4, device="cuda"), first)
    cuda.set_rng_state(state)
    assert all(
        torch.equal(a, b) for a, b in zip(torch.cuda.get_rng_state_all(), state[1], strict=True)
    )
    cuda.synchronize()


@pytest.mark.skipif(
    importlib.util.find_spec("torch_npu") is not None, reason="torch_npu is installed here"
)
def test_npu_without_torch_npu_says_it_is_not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "torch_npu", raising=False)
    assert get_backend("npu").is_available() == (False, "torch_npu is not installed")
    assert get_backend("npu").versions() == {}


def test_npu_with_a_broken_torch_npu_reports_the_import_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    package = tmp_path / "torch_npu"
    package.mkdir()
    (package / "__init__.py").write_text(
        textwrap.dedent(
            """
            raise OSError("libascendcl.so: cannot open shared object file")
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "torch_npu", raising=False)
    monkeypatch.setattr(_devices, "_TORCH_NPU_FAILURE", [])
    imports = []
    real_import = importlib.import_module
    monkeypatch.setattr(
        importlib, "import_module", lambda name: imports.append(name) or real_import(name)
    )
    for _ in range(3):
        available, reason = get_backend("npu").is_available()
        assert not available
        assert reason == (
            "torch_npu is installed but failed to import: "
            "OSError: libascendcl.so: cannot open shared object file"
        )
    assert imports == ["torch_npu"]  # a broken install is tried once, not on every check


def test_npu_whose_driver_query_raises_is_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeAccelerator(count=1)

    def broken() -> bool:
        raise RuntimeError("drvGetDevNum failed")

    fake.is_available = broken  # type: ignore[method-assign]
    install_fake_npu(monkeypatch, fake)
    available, reason = get_backend("npu").is_available()
    assert not available
    assert "RuntimeError: drvGetDevNum failed" in reason


def test_torch_npu_lazy_seed_queue_is_cut_back_on_restore(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    npu = FakeTorchNpu(count=2)  # like torch_npu: no seed tracker, a lazy-call queue
    install_fake_npu(monkeypatch, npu)
    backend = get_backend("npu")
    for seed in (11, 22, 33):
        state = backend.get_rng_state()
        backend.seed(seed)
        backend.set_rng_state(state)
    assert npu._queued_calls == []
    npu.init()
    assert npu.states == ["initial state 0", "initial state 1"]


def test_fake_npu_without_devices_says_none_is_visible(monkeypatch: pytest.MonkeyPatch) -> None:
    install_fake_npu(monkeypatch, FakeAccelerator(available=False))
    monkeypatch.setenv("ASCEND_RT_VISIBLE_DEVICES", "")
    assert get_backend("npu").is_available() == (
        False,
        "torch_npu is installed but no NPU is visible (ASCEND_RT_VISIBLE_DEVICES='')",
    )
    assert get_backend("npu") not in available_devices()


def test_fake_npu_calls_go_to_torch_npu(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeAccelerator(count=2)
    install_fake_npu(monkeypatch, fake)
    npu = get_backend("npu")
    assert npu.is_available() == (True, "2 device(s)")
    assert npu in available_devices()
    assert npu.versions() == {"torch_npu": "2.13.0.fake", "cann": "8.1.RC1"}
    state = npu.get_rng_state()
    npu.seed(11)
    assert fake.states == ["seeded 11", "seeded 11"]
    npu.set_rng_state(state)
    npu.synchronize()
    assert fake.calls == [
        ("manual_seed_all", 11),
        ("set_rng_state_all", ["initial state 0", "initial state 1"]),
        ("synchronize", 0),
        ("synchronize", 1),
    ]


def test_cann_version_before_8_1_is_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    install_fake_npu(monkeypatch, FakeAccelerator(), cann="")
    assert get_backend("npu").versions()["cann"] == "unknown"


def test_hccl_variables_come_too_late_once_distributed_is_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    npu = get_backend("npu")
    assert npu.late_env() == {}
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    assert set(npu.late_env()) == {"HCCL_DETERMINISTIC", "LCCL_DETERMINISTIC"}


def test_environment_fingerprint_is_json_and_describes_every_device(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    install_fake_npu(monkeypatch, FakeAccelerator(count=1))
    monkeypatch.setenv("HCCL_DETERMINISTIC", "TRUE")
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    fingerprint = json.loads(json.dumps(environment_fingerprint()))
    assert fingerprint["torch"] == torch.__version__
    assert set(fingerprint["devices"]) == {"cpu", "cuda", "npu"}
    assert fingerprint["devices"]["npu"]["versions"] == {
        "torch_npu": "2.13.0.fake",
        "cann": "8.1.RC1",
    }
    assert fingerprint["devices"]["cpu"]["available"] is True
    assert fingerprint["env"]["HCCL_DETERMINISTIC"] == "TRUE"
    assert fingerprint["env"]["CUBLAS_WORKSPACE_CONFIG"] is None
    assert "ASCEND_RT_VISIBLE_DEVICES" in fingerprint["env"]
    assert fingerprint["determinism"]["deterministic_algorithms"] is False
