#!/bin/bash
# One device call on the H200 host: fla's figures, ours (same run), then the GPU tests.
#   bash benchmarks/h200.sh [OPS_ARGS...]     needs .fla/ with the fla wheels and fla_ops_h200.py
# Env: TESTS (pytest -k expression, default all gpu tests; "none" skips), T_OPS / T_TESTS timeouts (s).
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
python3 -m pip install -q --no-deps --target /tmp/site .fla/*.whl >/dev/null 2>&1 || echo "fla install failed"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
(cd .fla && PYTHONPATH=/tmp/site RESULTS_DIR="$OUT" ONLY='gated_delta_rule,delta_rule,simple_gla(mamba2-like)' \
  EXTRAS=0 timeout 150 python3 fla_ops_h200.py > "$OUT/fla_ops.log" 2>&1) || echo "fla_ops rc=$?"
PYTHONPATH=/tmp/site RESULTS_DIR="$OUT" timeout 150 python3 benchmarks/fla_memory.py > "$OUT/fla_memory.log" 2>&1 \
  || echo "fla_memory rc=$?"
tail -3 "$OUT/fla_ops.log" "$OUT/fla_memory.log"
timeout "${T_OPS:-300}" python3 benchmarks/ops.py --fla "$OUT" --out "$OUT" "$@" 2>&1 | tee "$OUT/ops.log" \
  | grep -v "^ *File\|^    " | tail -60
if [ "${TESTS:-}" != "none" ]; then
  timeout "${T_TESTS:-200}" python3 -m pytest -q -x -m gpu tests/pallas_kernels/test_gpu_kernels.py \
    ${TESTS:+-k "$TESTS"} --durations=5 -p no:cacheprovider > "$OUT/tests.log" 2>&1; echo "tests rc=$?"
  tail -25 "$OUT/tests.log"
fi
