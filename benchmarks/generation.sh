#!/bin/bash
# The generation table in one device call on the GPU host (carry [".whl"]): lineax_lm's generate of
# the 475M Gated DeltaNet and its 3:1 hybrid beside fla's and HF Llama's `generate`
# (benchmarks/generation.py --run_torch; its docstring says what is measured). Writes
# $OUT/gen/generation.md (the table), generation.json, torch_generation.json and fla_autotune.tgz.
#   bash benchmarks/generation.sh [generation.py flags...]   e.g. --batches 1,64 --presets ...
# .whl/ (git-ignored) holds fla 0.6.0 and einops (`pip download --no-deps
# flash-linear-attention==0.6.0 fla-core==0.6.0 einops`) and the wheels launch/h200_env.sh
# installs where the host lacks a module. T_ALL bounds the whole run in seconds (default 570: a
# device call has 600); generation.py's --torch_timeout and --preset_timeout bound its parts.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/gen"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
source "$(dirname "$0")/../launch/h200_env.sh"
# fla 0.6.0 (its ops from the fla-core wheel, its models from flash-linear-attention) and einops
# travel in .whl/ with the rest, whatever their versions there
install_missing_wheels fla:fla_core fla.models:flash_linear_attention einops:einops || exit 2
timeout -k 10 "${T_ALL:-570}" python3 benchmarks/generation.py --run_torch --out "$OUT/gen" "$@" \
  2>&1 | tee "$OUT/gen/generation.log" | grep -v "Warning\|warn(" | tail -n 40
echo "generation.py rc=${PIPESTATUS[0]}"
