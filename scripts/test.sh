#!/usr/bin/env bash
# Set up a virtual environment (CPU torch) and run lint, the type check and the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
bash scripts/install_cpu_torch.sh .venv/bin/python
.venv/bin/python -m pip install -q -e '.[test,lint]'
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/lint-imports
.venv/bin/mypy
.venv/bin/python -m pytest -n 2 "$@"
