"""The device check (``scripts/device_check.sh``): the device-marked tests and the capture /
compare / replay figures on a CUDA or NPU device, written to one file (a markdown table of the
figures, then all of them as JSON). Small sizes, so that it takes under 5 minutes.

On a machine without an accelerator the device part is skipped with a one-line reason and the
CPU part runs: the same measurements at tiny sizes on the CPU (a smoke test of this script, its
figures are no measurement) and a check that the device tests are collected. Exit status 0
unless a device test fails or a measurement raises.

    python benchmarks/device_check.py [--out results/device-check.md] [--cpu-only]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pytest_precision import capture, compare_dumps, compare_tensors, load_dump, replay_op

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "results" / "device-check.md"
#: The HF Llama of ``_hf_llama.py`` (120M parameters) on the device; a tiny one on the CPU.
DEVICE_LLAMA = {
    "vocab_size": 8192,
    "hidden_size": 1024,
    "intermediate_size": 2816,
    "num_hidden_layers": 8,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
}
CPU_LLAMA = {
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
}
#: (sequence length, elements per tensor pair of the metrics figure, timing repeats)
DEVICE_SIZES = (256, 1 << 26, 3)
CPU_SIZES = (16, 1 << 16, 1)
#: The device tests' own time limit (the whole check stays under 5 minutes).
TESTS_TIMEOUT_S = 150


@dataclass(frozen=True)
class Figure:
    name: str
    device: str
    value: float
    unit: str
    note: str = ""


def accelerator() -> tuple[str | None, str]:
    """The accelerator to check (``cuda``, ``npu``) or None, and one line saying why."""
    if torch.cuda.is_available():
        return "cuda", torch.cuda.get_device_name(0)
    if importlib.util.find_spec("torch_npu") is None:
        return None, f"no CUDA device (torch {torch.__version__}) and torch_npu is not installed"
    try:
        import torch_npu  # noqa: F401  (registers torch.npu)
    except Exception as exc:
        return None, f"no CUDA device and torch_npu fails to import: {str(exc)[:120]}"
    if torch.npu.is_available():  # type: ignore[attr-defined]
        return "npu", torch.npu.get_device_name(0)  # type: ignore[attr-defined]
    return None, "no CUDA device and torch_npu sees no NPU"


def _sync(device: str) -> None:
    if device != "cpu":
        getattr(torch, device).synchronize()


def _seconds(run: Callable[[], object], device: str, repeat: int) -> float:
    """The fastest of ``repeat`` runs after one warm-up, the device drained at both ends."""
    run()
    best = float("inf")
    for _ in range(repeat):
        _sync(device)
        start = time.perf_counter()
        run()
        _sync(device)
        best = min(best, time.perf_counter() - start)
    return best


def _llama(config: dict[str, int], device: str) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    full = {**config, "max_position_embeddings": 512, "use_cache": False}
    return LlamaForCausalLM(LlamaConfig(**full, attn_implementation="eager")).eval().to(device)


def measure(device: str, work: Path) -> list[Figure]:
    """Capture, compare and replay figures on ``device`` (tiny sizes on the CPU)."""
    on_cpu = device == "cpu"
    seq, numel, repeat = CPU_SIZES if on_cpu else DEVICE_SIZES
    note = "smoke test at tiny sizes, not a measurement" if on_cpu else ""
    model = _llama(CPU_LLAMA if on_cpu else DEVICE_LLAMA, device)
    ids = torch.randint(3, model.config.vocab_size, (1, seq), generator=torch.Generator())
    ids = ids.to(device)
    figures: list[Figure] = []

    with torch.no_grad():
        bare = _seconds(lambda: model(ids), device, repeat)
        figures.append(Figure("forward, bare", device, bare * 1e3, "ms", note))
        for mode in ("statistics", "tensor"):
            folder = work / f"capture-{mode}"

            def captured(mode: str = mode, folder: Path = folder) -> None:
                shutil.rmtree(folder, ignore_errors=True)
                with capture(model, folder, level="mix", mode=mode):  # type: ignore[arg-type]
                    model(ids)

            seconds = _seconds(captured, device, repeat)
            figures.append(
                Figure(f"capture ({mode}, mix level) / bare forward", device, seconds / bare, "x",
                       note)
            )  # fmt: skip

    # Two tensor dumps: the forward, and again with one weight a millionth off (every later
    # tensor differs a little), for compare_dumps and replay_op.
    golden, target = work / "golden", work / "target"
    with torch.no_grad():
        for folder in (golden, target):
            if folder is target:
                model.get_submodule("model.layers.0.mlp.down_proj").weight.mul_(1.0 + 1e-6)
            with capture(model, folder, level="mix", mode="tensor"):
                model(ids)
    dump_bytes = sum(f.stat().st_size for f in golden.rglob("*.safetensors"))
    start = time.perf_counter()
    comparison = compare_dumps(golden, target)
    seconds = time.perf_counter() - start
    figures.append(
        Figure("compare_dumps of two tensor dumps (on the host)", device,
               2 * dump_bytes / seconds / 1e9, "GB/s", note or f"verdict {comparison.verdict}")
    )  # fmt: skip

    generator = torch.Generator().manual_seed(1)
    expected = torch.randn(numel, generator=generator).to(device)
    actual = expected * (1 + 1e-6 * torch.randn(numel, generator=generator).to(device))
    seconds = _seconds(lambda: compare_tensors(actual, expected), device, repeat)
    figures.append(
        Figure(f"compare_tensors on the device, 2 x {numel:,} fp32", device,
               2 * numel * 4 / seconds / 1e9, "GB/s", note)
    )  # fmt: skip

    linear = next(
        r.name for r in load_dump(target).records if r.name.startswith("Functional.linear")
    )
    seconds = _seconds(lambda: replay_op(target, linear, device, golden=golden), device, 1)
    figures.append(Figure(f"replay_op {linear} on the device", device, seconds * 1e3, "ms", note))
    return figures


def device_tests(work: Path) -> dict[str, Any]:
    """The device-marked tests in a subprocess: counts and seconds (a time limit keeps the
    whole check under 5 minutes)."""
    report = work / "device-tests.xml"
    command = [sys.executable, "-m", "pytest", "-m", "device", "-q", "-p", "no:cacheprovider",
               f"--junitxml={report}", str(ROOT / "tests")]  # fmt: skip
    start = time.perf_counter()
    try:
        done = subprocess.run(command, cwd=ROOT, timeout=TESTS_TIMEOUT_S, check=False)
        returncode = done.returncode
    except subprocess.TimeoutExpired:
        returncode = 124
    seconds = time.perf_counter() - start
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    if report.is_file():
        suite = ET.parse(report).getroot()
        suite = suite if suite.tag == "testsuite" else suite[0]
        counts = {key: int(suite.get(key, 0)) for key in counts}
    return {**counts, "returncode": returncode, "seconds": round(seconds, 1)}


def device_tests_collected() -> int:
    """How many device-marked tests pytest collects (the CPU part: they exist and import)."""
    command = [sys.executable, "-m", "pytest", "-m", "device", "--collect-only", "-q",
               "-p", "no:cacheprovider", str(ROOT / "tests" / "device"),
               str(ROOT / "tests" / "runtime" / "test_devices.py")]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    if done.returncode not in (0, 5):
        raise RuntimeError(f"collecting the device tests failed:\n{done.stdout}{done.stderr}")
    return sum(1 for line in done.stdout.splitlines() if "::" in line)


def render(record: dict[str, Any]) -> str:
    lines = [
        "# Device check",
        "",
        f"- machine: {record['machine']}",
        f"- device: {record['device'] or 'none'} ({record['device_line']})",
    ]
    if record["skipped"]:
        lines.append(f"- device part skipped: {record['skipped']}")
    tests = record.get("device_tests")
    if tests:
        lines.append(
            f"- device tests: {tests['tests']} run, {tests['failures']} failed, "
            f"{tests['errors']} errors, {tests['skipped']} skipped in {tests['seconds']} s"
        )
    lines += ["", "| figure | device | value | unit | note |", "|---|---|---:|---|---|"]
    for f in record["figures"]:
        lines.append(
            f"| {f['name']} | {f['device']} | {f['value']:.3g} | {f['unit']} | {f['note']} |"
        )
    lines += ["", "```json", json.dumps(record, indent=1), "```", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the one results file")
    parser.add_argument("--cpu-only", action="store_true", help="skip the device part")
    args = parser.parse_args(argv)

    device, line = accelerator()
    skipped = "--cpu-only" if args.cpu_only else None if device is not None else line
    record: dict[str, Any] = {
        "machine": f"{platform.node()}, {platform.machine()}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads",
        "device": None if skipped else device,
        "device_line": line,
        "skipped": skipped,
    }
    failed = False
    with tempfile.TemporaryDirectory(prefix="device-check-") as temp:
        work = Path(temp)
        if skipped:
            print(f"SKIP device part: {skipped}")
            record["device_tests_collected"] = device_tests_collected()
            figures = measure("cpu", work)
        else:
            assert device is not None
            record["device_tests"] = tests = device_tests(work)
            failed = tests["returncode"] not in (0, 5) or tests["failures"] + tests["errors"] > 0
            figures = measure(device, work)
    record["figures"] = [asdict(f) for f in figures]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(render(record))
    print(render(record).split("```json")[0].rstrip())
    print(f"figures written to {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
