#!/usr/bin/env bash
# GPU check: real Triton on CUDA vs the torch twins, CUDA-graph capture/replay under
# torch.cuda.set_sync_debug_mode("error"), and µs per build (fused vs eager); --engine adds the
# engine on CUDA; --hf checks the Hugging Face adapter on CUDA instead. Runs on a CUDA machine with torch and triton installed; uses the checkout in
# place (no install). --dry-run runs it on the CPU with the Triton interpreter (no GPU results).
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ " $* " == *" --dry-run "* ]]; then
    export TRITON_INTERPRET=1
else
    unset TRITON_INTERPRET
fi
PYTHON=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
if [[ " $* " == *" --hf "* ]]; then
    # The Hugging Face adapter on CUDA (needs transformers there): float32 and bf16, lossless
    # against transformers' generate on the same device, tokens/s of NONE and NGRAM.
    args=()
    for a in "$@"; do [[ $a == --hf ]] || args+=("$a"); done
    exec "$PYTHON" bench/gpu_check_hf.py "${args[@]}"
fi
"$PYTHON" bench/gpu_check.py "$@"
