"""The device paths, on a real CUDA or NPU device (skipped on a CPU-only machine; run them with
``scripts/device_check.sh`` or ``pytest -m device``): seeding and determinism, metrics and
statistics computed on the device, capture of a model on the device (no synchronisation per
record), replay of a CPU-recorded op on the device, and a golden recorded on CPU checked on the
device."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from device_helpers import ACCELERATOR, needs_device

from pytest_precision import (
    Golden,
    assert_deterministic,
    capture,
    compare_tensors,
    load_dump,
    replay_op,
    seed_all,
    tensor_stats,
)

pytestmark = needs_device
DEVICE = ACCELERATOR or "cpu"


def _model(device: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return (
        torch.nn.Sequential(
            torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 64), torch.nn.Tanh()
        )
        .eval()
        .to(device)
    )


def _input(device: str) -> torch.Tensor:
    return torch.randn(8, 64, generator=torch.Generator().manual_seed(1)).to(device)


def test_seed_all_seeds_the_device_and_restores_its_state() -> None:
    with seed_all(7):
        first = torch.rand(16, device=DEVICE)
    with seed_all(7):
        again = torch.rand(16, device=DEVICE)
    assert torch.equal(first, again)


def test_a_forward_on_the_device_is_deterministic() -> None:
    model, x = _model(DEVICE), _input(DEVICE)
    with torch.no_grad():
        assert_deterministic(model, x, runs=3, locate=model)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_metrics_on_the_device_are_the_cpu_s(dtype: torch.dtype) -> None:
    golden = torch.randn(4096, generator=torch.Generator().manual_seed(2))
    target = (golden * (1 + 1e-3 * torch.randn(4096))).to(dtype)
    on_cpu = compare_tensors(target, golden.to(dtype))
    on_device = compare_tensors(target.to(DEVICE), golden.to(dtype).to(DEVICE))
    assert on_device.verdict == on_cpu.verdict
    assert on_device.max_abs_err == pytest.approx(on_cpu.max_abs_err)
    stats, cpu_stats = tensor_stats(target.to(DEVICE)), tensor_stats(target)
    assert (stats.max, stats.min, stats.numel) == (cpu_stats.max, cpu_stats.min, cpu_stats.numel)
    assert stats.mean == pytest.approx(cpu_stats.mean, rel=1e-9, abs=1e-12)
    assert stats.norm == pytest.approx(cpu_stats.norm, rel=1e-9)


@pytest.mark.parametrize("mode", ["statistics", "tensor"])
def test_capture_on_the_device_matches_the_cpu_capture(mode: str, tmp_path: Path) -> None:
    dumps = {}
    for where, device in (("host", "cpu"), ("device", DEVICE)):
        model, x = _model(device), _input(device)
        with torch.no_grad(), capture(model, tmp_path / where, level="mix", mode=mode):  # type: ignore[arg-type]
            model(x)
        dumps[where] = load_dump(tmp_path / where).records
    assert [r.name for r in dumps["device"]] == [r.name for r in dumps["host"]]
    for on_cpu, on_device in zip(dumps["host"], dumps["device"], strict=True):
        if on_cpu.stats is None:
            continue
        assert on_device.stats is not None
        assert on_device.stats.mean == pytest.approx(on_cpu.stats.mean, rel=1e-4, abs=1e-5)
        assert on_device.stats.norm == pytest.approx(on_cpu.stats.norm, rel=1e-4)


@pytest.mark.skipif(ACCELERATOR != "cuda", reason="torch's sync debug mode is CUDA's")
def test_capture_on_cuda_does_not_synchronise_per_record(tmp_path: Path) -> None:
    """torch's sync debug mode warns at each synchronising call on this thread: more forwards
    (more records) must not bring more of them."""
    model, x = _model("cuda"), _input("cuda")

    def synchronisations(forwards: int, path: Path) -> int:
        torch.cuda.synchronize()
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                with torch.no_grad(), capture(model, path, level="mix", mode="statistics") as cap:
                    for step in range(forwards):
                        cap.step(step)
                        model(x + step)
                    torch.cuda.set_sync_debug_mode("default")  # closing the dump may wait
            finally:
                torch.cuda.set_sync_debug_mode("default")
        return sum("synchroniz" in str(w.message) for w in seen)

    few = synchronisations(2, tmp_path / "few")
    many = synchronisations(16, tmp_path / "many")
    assert many <= few + 2, (few, many)


def test_an_op_recorded_on_cpu_replays_on_the_device(tmp_path: Path) -> None:
    model, x = _model("cpu"), _input("cpu")
    with torch.no_grad(), capture(model, tmp_path / "dump", level="op", mode="tensor"):
        model(x)
    records = load_dump(tmp_path / "dump").records
    name = next(r.name for r in records if r.name.startswith("Functional.linear"))
    result = replay_op(tmp_path / "dump", name, DEVICE)
    assert result.device.startswith(ACCELERATOR or "cpu")
    assert result.verdict == "noise", result.reason


def test_a_golden_recorded_on_cpu_passes_on_the_device(tmp_path: Path) -> None:
    test_id = "tests/test_model.py::test_linear"
    weight = torch.randn(64, 64, generator=torch.Generator().manual_seed(3))
    x = _input("cpu")

    def linear(device: str) -> torch.Tensor:
        return (x.to(device) @ weight.to(device)).cpu()

    reference = x.double() @ weight.double()
    assert Golden(tmp_path, test_id, update=True)(linear("cpu"), "out", reference=reference) is None
    comparison = Golden(tmp_path, test_id)(linear(DEVICE), "out")
    assert comparison is not None
    assert comparison.verdict == "pass"
