#!/bin/bash
# One device call on the GPU host: the `gpu` tests, our op rows, fla's rows from the same call, and
# the table of ratios (python -m pallas_kernels.bench --report).
#   bash benchmarks/h200.sh [pallas_kernels.bench arguments...]   e.g. --ops gla,hgrn --backends gpu
# Env: TESTS   test files of the `gpu` tests ("none" skips; default: tests/), TESTS_K a -k expression
#      FLA_OPS fla's ops to time (benchmarks/fla_ops.py names; "" skips fla), FLA_SHAPES (BxT list)
#      TEST_WORKERS pytest-xdist processes for the tests (default 10: each test compiles its own
#      kernels on the host CPU; all 183 passed in 448 s at 10 workers on an H100; each worker
#      takes its share of GPU memory, tests/conftest.py), every outcome in $OUT/tests.log as it comes
#      T_TESTS, T_OPS, T_FLA: time limits in seconds (T_TESTS 500 by default: the lane alone is a
#      device call; give the ops and fla a call of their own with TESTS=none).
# Carry [".whl"]: fla needs the wheels flash-linear-attention==0.6.0, fla-core==0.6.0 and einops in .whl/
# (git-ignored; `pip download --no-deps` them). fla autotunes every kernel on a fresh machine
# (minutes per op family): the call starts from benchmarks/fla_autotune.tgz, and Triton's
# choices come back as $OUT/fla_autotune.tgz: copy that over the archive to keep them.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
# The lineax_lm tests import grain & co. and run under pytest-xdist: wheels in .whl/ (git-ignored)
# install where the host has none.
source "$(dirname "$0")/../launch/h200_env.sh"
install_missing_wheels xdist:pytest_xdist execnet:execnet hypothesis:hypothesis \
  sortedcontainers:sortedcontainers || echo "some test modules are missing: the tests may not run"
if [ "${TESTS:-}" != "none" ]; then
  # shellcheck disable=SC2086  # TESTS is a list of paths: split on purpose
  timeout "${T_TESTS:-500}" python3 -m pytest -v -rf --tb=short -W ignore -n "${TEST_WORKERS:-10}" -m gpu ${TESTS:-tests} ${TESTS_K:+-k "$TESTS_K"} \
    --durations=5 -p no:cacheprovider \
    > "$OUT/tests.log" 2>&1; echo "tests rc=$?"
  # A timed-out pytest leaves its xdist workers running (on the GPU and the CPUs): end them before
  # anything is timed.
  pkill -f "pytest -v -rf"; pkill -f "exec(eval(sys.stdin.readline()))"; sleep 1  # execnet workers
  grep -E "^FAILED|passed|failed" "$OUT/tests.log" | tail -n 12
fi
timeout "${T_OPS:-300}" python3 -m pallas_kernels.bench --out "$OUT" "$@" > "$OUT/ops.log" 2>&1 || echo "ops rc=$?"
grep -v "^ *File\|^    \|^Traceback\|^---\|^For simplicity\|^|" "$OUT/ops.log" | grep -v "^$" | tail -n 6
if [ -n "${FLA_OPS-gated_delta_rule}" ]; then
  install_missing_wheels fla:fla_core fla.models:flash_linear_attention einops:einops \
    || echo "fla install failed"
  export TRITON_CACHE_DIR=/tmp/triton_cache; mkdir -p "$TRITON_CACHE_DIR"
  tar xzf benchmarks/fla_autotune.tgz -C "$TRITON_CACHE_DIR"
  timeout "${T_FLA:-300}" python3 benchmarks/fla_ops.py --out "$OUT" \
    --ops "${FLA_OPS-gated_delta_rule}" --shapes "${FLA_SHAPES:-4x4096,8x8192}" > "$OUT/fla_ops.log" 2>&1 \
    || echo "fla_ops rc=$?"
  grep -i "error" "$OUT/fla_ops.log" | tail -n 3
  (cd "$TRITON_CACHE_DIR" && find . -name "*.autotune.json" | tar czf "$OUT/fla_autotune.tgz" -T -)
fi
python3 -m pallas_kernels.bench --report --fla "$OUT" --out "$OUT" 2>&1 | tail -n 40
