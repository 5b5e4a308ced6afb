#!/usr/bin/env bash
# Every check that needs a GPU, in one go, for a machine that has one: the CUDA tests (which skip
# without CUDA elsewhere), then the GPU benchmarks (gpu_stream.py, and lm_gpu.py with transformers). Prints a summary; writes logs and figures to OUT.
#
#   bash benchmarks/gpu_checks.sh [OUT]        # OUT defaults to gpu-checks/; PYTHON picks the interpreter
#
# Exit status: 0 when every CUDA test passed and the benchmark ran, 1 otherwise (and 0, with a note, without CUDA).
set -u
cd "$(dirname "$0")/.."
if [ -z "${PYTHON:-}" ]; then
    PYTHON=python
    [ -x .venv/bin/python ] && PYTHON=.venv/bin/python
fi
OUT=${1:-gpu-checks}
mkdir -p "$OUT"

if ! "$PYTHON" -c "import torch, tempcal" 2>/dev/null; then
    echo "gpu_checks: $PYTHON cannot import torch and tempcal; set PYTHON to the environment's interpreter"
    exit 1
fi
if ! "$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu_checks: no CUDA device here; nothing to check"
    exit 0
fi
"$PYTHON" - <<'PY' | tee "$OUT/device.txt"
import torch
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.device_count()} device(s):",
      ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())))
PY

status=0
# The CUDA tests: every test or parameter named for CUDA (the others already ran on the CPU).
timeout 420 "$PYTHON" -m pytest -q -p no:cacheprovider -rs -k "cuda or lstm" \
    --junitxml="$OUT/cuda-tests.xml" tests > "$OUT/cuda-tests.log" 2>&1 || status=1
tail -n 25 "$OUT/cuda-tests.log"

# The copy/compute overlap of the streamed pass (see the script's docstring for the figures).
timeout 240 "$PYTHON" benchmarks/gpu_stream.py --size-gb 2 --json "$OUT/gpu_stream.json" \
    2>&1 | tee "$OUT/gpu_stream.log" || status=1

# tempcal fit --lm on a 0.6B model built on the GPU (needs transformers: the lm extra).
if "$PYTHON" -c "import transformers" 2>/dev/null; then
    timeout 480 "$PYTHON" benchmarks/lm_gpu.py --results "$OUT/lm_gpu.md" --json "$OUT/lm_gpu.json" \
        2>&1 | tee "$OUT/lm_gpu.log" || status=1
else
    echo "gpu_checks: transformers is not installed; lm_gpu.py skipped (pip install 'tempcal[lm]')"
fi

echo "gpu_checks: $([ $status -eq 0 ] && echo passed || echo FAILED) (logs in $OUT/)"
exit $status
