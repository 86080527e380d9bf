#!/usr/bin/env bash
# Install the CPU build of torch 2.13.0 into the given Python environment.
# A bare `torch==2.13.0` from PyPI is the CUDA build on Linux (gigabytes of CUDA libraries); the
# `+cpu` local version names the CPU wheel, found in the configured indexes / find-links or else
# on PyTorch's CPU index.
set -euo pipefail
python="${1:?usage: install_cpu_torch.sh PYTHON}"
if ! "$python" -m pip install -q "torch==2.13.0+cpu" 2>/dev/null; then
    "$python" -m pip install -q "torch==2.13.0+cpu" --extra-index-url https://download.pytorch.org/whl/cpu
fi
"$python" -c 'import torch, sys; sys.exit(0 if torch.version.cuda is None else "a CUDA torch was installed")'
