"""Plain ``assert_close_to_golden`` on low-precision layers: the float64 rerun's bar.

Each decoder layer's output and the logits of tiny bf16 / fp16 HF models (``tests/layer_models``:
Llama, GPT-2, Gemma, Qwen2, Mistral, Phi-3), asserted with the plain line, no ``reference=``:
recorded with ``pytest --golden-dir D --golden-update`` (the plugin reruns each test in float64
and stores the references), then checked with ``pytest --golden-dir D`` against the honest port
(the same weights computed in float32, values returned in the dtype) and three planted bugs in
layer 1 (a weight not loaded, the causal mask dropped, q / k rows swapped). Prints false alarms,
the worst honest score, and for each bug where it first fails with its score (above 1 fails).

    python benchmarks/golden_float64_rerun.py [--archs llama,gpt2] [--dtypes bf16]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUGS = ("weight_not_loaded", "no_causal_mask", "qk_swap")

TEST = """
import os

import pytest
import torch

import layer_models as lm
from pytest_precision import assert_close_to_golden

ARCHS = os.environ["LAYER_ARCHS"].split(",")
DTYPES = os.environ["LAYER_DTYPES"].split(",")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("arch", ARCHS)
def test_layers(arch, dtype):
    which = os.environ["LAYER_VARIANT"]
    model = lm.variant(arch, lm.DTYPES[dtype], which)
    outputs = []
    for block in lm.blocks(model):
        block.register_forward_hook(lambda m, a, out: outputs.append(out))
    with torch.no_grad():
        logits = model(lm.inputs(), use_cache=False).logits
    for i, out in enumerate(outputs + [logits]):
        out = out[0] if isinstance(out, tuple) else out
        # the golden is the model in its dtype; a port returns its float32 values in the dtype
        assert_close_to_golden(out.to(lm.DTYPES[dtype]), name=f"layer{i}")
"""


def run(folder: Path, variant: str, archs: str, dtypes: str, *args: str) -> list[dict]:
    env = {
        **os.environ,
        "LAYER_VARIANT": variant,
        "LAYER_ARCHS": archs,
        "LAYER_DTYPES": dtypes,
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")]),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
    }
    report = folder / "report.json"
    command = [sys.executable, "-m", "pytest", "-q", "-rN", "-p", "no:cacheprovider"]
    command += ["--golden-dir", "goldens", "--precision-report", str(report), *args]
    subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, check=False)
    return json.loads(report.read_text())["comparisons"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--archs", default="llama,gpt2,gemma,qwen2,mistral,phi3")
    parser.add_argument("--dtypes", default="bf16,fp16")
    args = parser.parse_args()
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "test_layers.py").write_text(TEST)
        records = run(folder, "golden", args.archs, args.dtypes, "--golden-update")
        kinds: dict[str, int] = {}
        for r in records:
            kind = (r.get("envelope") or {}).get("kind")
            kinds[str(kind)] = kinds.get(str(kind), 0) + 1
        print(f"recorded {len(records)} goldens; envelopes: {kinds}")
        for variant in ("golden", "port"):
            records = run(folder, variant, args.archs, args.dtypes)
            alarms = [r for r in records if r["status"] != "pass"]
            worst = max((r["envelope"]["excess"] or 0.0) for r in records)
            print(f"{variant:>17}: false alarms {len(alarms)} / {len(records)}, worst {worst:.3f}")
        for bug in BUGS:
            records = run(folder, bug, args.archs, args.dtypes)
            tests: dict[str, list[dict]] = {}
            for r in records:
                tests.setdefault(r["test"].split("::")[-1], []).append(r)
            lines = []
            for test, rs in tests.items():
                first = next((r for r in rs if r["status"] != "pass"), None)
                where = "none" if first is None else first["name"]
                score = "" if first is None else f" {first['envelope']['excess']:.2f}"
                lines.append(f"{test[len('test_layers') :]} {where}{score}")
            at_layer1 = sum(line.split()[1] == "layer1" for line in lines)
            print(f"{bug:>17}: first fails at layer1 in {at_layer1} / {len(lines)}")
            for line in lines:
                print(f"{'':>19}{line}")
    print(f"{time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
