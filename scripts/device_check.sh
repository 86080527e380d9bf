#!/usr/bin/env bash
# The device check (docs/device-check.md): on a machine with CUDA or an Ascend NPU, the
# device-marked tests and the capture / compare / replay figures on the device, in under
# 5 minutes, written to one file (default results/device-check.md). Without an accelerator it
# prints "SKIP device part: <reason>", runs the CPU part and exits 0.
#   bash scripts/device_check.sh [--out FILE] [--cpu-only]
# PYTHON picks the interpreter (default: .venv/bin/python when there is one, else python3).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${PYTHON:-}" ]; then
    if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
# cuBLAS is deterministic (assert_deterministic's runs) only with this set before CUDA starts.
export CUBLAS_WORKSPACE_CONFIG="${CUBLAS_WORKSPACE_CONFIG:-:4096:8}"
exec timeout 290 "$PYTHON" benchmarks/device_check.py "$@"
