#!/usr/bin/env bash
# Set up a virtual environment (CPU torch) and run the worked example.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q torch==2.13.0
.venv/bin/python -m pip install -q -e '.[fast]'
.venv/bin/python examples/demo.py "$@"
