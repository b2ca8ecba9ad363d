#!/bin/bash
# One device call on the H200 host: ours, then fla's figures (same run), ratios, then the GPU tests.
#   bash benchmarks/h200.sh [OPS_ARGS...]     needs .fla/ with the fla wheels and fla_ops_h200.py
# Env: FLA_ONLY (fla op names), TESTS (pytest -k expression; "none" skips), T_OPS / T_FLA / T_FLAMEM /
# T_TESTS timeouts in seconds; EXTRAS=1: fla_memory.py also times fla's GDN (step and device-busy time)
# at the anchor shape and the --scaling lengths (LENGTHS).
# fla autotunes every kernel on a fresh machine (150-300 s an op family): its choices (Triton's
# *.autotune.json, kept because fla sets cache_results) come back as $OUT/fla_autotune.tgz; put that
# file in .fla/ and later calls start from them.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
python3 -m pip install -q --no-deps --target /tmp/site .fla/*.whl >/dev/null 2>&1 || echo "fla install failed"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
timeout "${T_OPS:-300}" python3 benchmarks/ops.py --out "$OUT" "$@" > "$OUT/ops.log" 2>&1 || echo "ops rc=$?"
grep -v "^ *File\|^    \|^Traceback\|^---\|^For simplicity" "$OUT/ops.log" | grep -v "^$" | tail -12
FLA_ONLY=${FLA_ONLY:-gated_delta_rule}
export TRITON_CACHE_DIR=/tmp/triton_cache; mkdir -p "$TRITON_CACHE_DIR"
[ -f .fla/fla_autotune.tgz ] && tar xzf .fla/fla_autotune.tgz -C "$TRITON_CACHE_DIR"
(cd .fla && PYTHONPATH=/tmp/site RESULTS_DIR="$OUT" ONLY="$FLA_ONLY" EXTRAS=0 \
  timeout "${T_FLA:-200}" python3 fla_ops_h200.py > "$OUT/fla_ops.log" 2>&1) || echo "fla_ops rc=$?"
PYTHONPATH=/tmp/site RESULTS_DIR="$OUT" ONLY="$FLA_ONLY" timeout "${T_FLAMEM:-60}" python3 benchmarks/fla_memory.py \
  > "$OUT/fla_memory.log" 2>&1 || echo "fla_memory rc=$?"
grep "^gated\|^delta\|^simple" "$OUT/fla_ops.log"; tail -n 1 "$OUT/fla_memory.log"
(cd "$TRITON_CACHE_DIR" && find . -name "*.autotune.json" | tar czf "$OUT/fla_autotune.tgz" -T -)
python3 benchmarks/ops.py --report --fla "$OUT" --out "$OUT" 2>&1 | tail -20
if [ "${TESTS:-}" != "none" ]; then
  timeout "${T_TESTS:-200}" python3 -m pytest -q -x -m gpu tests/pallas_kernels/test_gpu_kernels.py \
    ${TESTS:+-k "$TESTS"} --durations=5 -p no:cacheprovider > "$OUT/tests.log" 2>&1; echo "tests rc=$?"
  tail -n 15 "$OUT/tests.log"
fi
