#!/usr/bin/env bash
# GPU check: real Triton on CUDA vs the torch twins, CUDA-graph capture/replay under
# torch.cuda.set_sync_debug_mode("error"), and µs per build (fused vs eager).
# Runs on a CUDA machine with torch and triton installed; uses the checkout in place (no install).
set -euo pipefail
cd "$(dirname "$0")/.."
unset TRITON_INTERPRET
PYTHON=${PYTHON:-python3}
PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 "$PYTHON" bench/gpu_check.py "$@"
