#!/bin/bash
# This tree's op rows beside an earlier tree's, timed in one device call (the baseline first, then
# this tree, each in a process of its own), and the table of baseline/ours ratios
# (python -m pallas_kernels.bench --report --baseline):
#   bash benchmarks/ab.sh BASE [benchmarks/ops.py flags...]
#   e.g. bash benchmarks/ab.sh 0feef80 --ops gated_delta_rule --backends gpu --hkv 4,256,512 \
#          --shapes 1x32768
# BASE is a git revision of this repository (its pallas_kernels/ and benchmarks/ops.py are
# archived into a temporary folder) or a folder holding such an archive: on a machine without the
# repository's history, make it beside the checkout first,
#   git archive REV pallas_kernels benchmarks/ops.py | (mkdir -p ab_REV && tar x -C ab_REV)
# copy ab_REV with the checkout and give it as BASE. The baseline runs with this
# tree's lineax_lm (ops.py's flag parsing) and is timed by this tree's pallas_kernels/bench.py
# (copied over the baseline's), so the two rows differ by their kernels alone. Writes
# $OUT/base/ops.json, $OUT/this/ops.json and $OUT/ab.md. Env: T_EACH, seconds each tree's run may take (default 280); PYTHON (python3).
set -u
OUT=${OUT:-/tmp/out}
if [ $# -lt 1 ]; then
  echo "usage: bash benchmarks/ab.sh BASE [benchmarks/ops.py flags...] (BASE: a git revision or a folder)"
  exit 2
fi
base=$1; shift
root=$(cd "$(dirname "$0")/.." && pwd)
tree=$(mktemp -d)
trap 'rm -rf "$tree"' EXIT
if [ -f "$base/benchmarks/ops.py" ]; then
  cp -r "$base/." "$tree"
elif ! git archive "$base" pallas_kernels benchmarks/ops.py | tar x -C "$tree"; then
  echo "BASE $base: neither a folder with benchmarks/ops.py nor a git revision of this repository"
  exit 2
fi
cp "$root/pallas_kernels/bench.py" "$tree/pallas_kernels/bench.py"
mkdir -p "$OUT/base" "$OUT/this"
PYTHONPATH=$root${PYTHONPATH:+:$PYTHONPATH} timeout "${T_EACH:-280}" "${PYTHON:-python3}" "$tree/benchmarks/ops.py" \
  "$@" --out "$OUT/base" > "$OUT/base/ops.log" 2>&1 || echo "baseline rc=$? (its log: $OUT/base/ops.log)"
timeout "${T_EACH:-280}" "${PYTHON:-python3}" "$root/benchmarks/ops.py" "$@" --out "$OUT/this" \
  > "$OUT/this/ops.log" 2>&1 || echo "this tree rc=$? (its log: $OUT/this/ops.log)"
"${PYTHON:-python3}" "$root/benchmarks/ops.py" --report --out "$OUT/this" --baseline "$OUT/base" | tee "$OUT/ab.md"
