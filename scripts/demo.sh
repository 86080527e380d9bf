#!/usr/bin/env bash
# Set up a virtual environment (CPU torch) once, then run the worked example.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
# Install only what is missing: a second run starts the demo at once.
if ! .venv/bin/python -c "import torch, numba, pytest_precision" >/dev/null 2>&1; then
    .venv/bin/python -m pip install -q --upgrade pip
    bash scripts/install_cpu_torch.sh .venv/bin/python
    .venv/bin/python -m pip install -q -e '.[fast]'
fi
.venv/bin/python examples/demo.py "$@"
