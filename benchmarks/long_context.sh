#!/bin/bash
# Long-context training on one GPU: B=1 at T = 32,768, 65,536 and 131,072 (the same model trained on
# ever longer rows), for the 340M Gated DeltaNet, its 3:1 hybrid and the Transformer preset (cuDNN
# flash attention), with fla's GatedDeltaNet and HF's Llama from the same call: where attention's
# quadratic cost takes over, and whether we stay ahead of fla. The GDN on segments of T
# (`gated_deltanet_340m_fla@4`, `@auto`) is left out by default: at T = 32,768 on an H100 4 segments
# ran at 0.98x the whole op and 16 ran out of memory (benchmarks/RESULTS.md).
#   LENGTHS=65536 bash benchmarks/long_context.sh    # one length: one device call (<= 600 s)
#   bash benchmarks/long_context.sh                  # every length (a host without a time limit)
# Env: LENGTHS (space-separated T), PRESETS (train_step.py --presets), REMAT_ABOVE (T above which
#      both sides recompute each layer's activations in the backward: remat="full" here, gradient
#      checkpointing for the torch models; default 65536 on a GPU of more than 100 GB, 32768 below:
#      at T = 65,536 the 3:1 hybrid peaked at 92.3 GiB without it on the H200, more than an 80 GB
#      H100 holds), T_LIMIT (seconds per length), STEPS, TORCH_UP_TO (the longest T the torch
#      models run at, default 65536: HF Llama with gradient checkpointing takes minutes a step
#      beyond it).
# Each length is one train_step.py call (each preset in a process of its own, torch first), its
# rows in $OUT/long_T<T>.json; the table at the end puts every length side by side.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
source "$(dirname "$0")/../launch/h200_env.sh"
# fla 0.6.0 (its ops from the fla-core wheel, its models from flash-linear-attention) and einops
# travel in .whl/ with the rest
install_missing_wheels fla:fla_core fla.models:flash_linear_attention einops:einops || exit 2
PRESETS=${PRESETS:-gated_deltanet_340m_fla,gated_deltanet_340m_fla:3:1,transformer_340m}
gpu_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -n 1)
remat_above=65536; [ "${gpu_mib:-0}" -lt 100000 ] && remat_above=32768
for T in ${LENGTHS:-32768 65536 131072}; do
  remat=none; [ "$T" -gt "${REMAT_ABOVE:-$remat_above}" ] && remat=full
  echo "== T=$T remat=$remat"
  torch=--run_torch; [ "$T" -gt "${TORCH_UP_TO:-65536}" ] && torch=
  timeout -k 30 "${T_LIMIT:-560}" python3 benchmarks/train_step.py $torch --batch 1 --seq "$T" \
    --remat "$remat" --steps "${STEPS:-3}" --presets "$PRESETS" --json "$OUT/long_T$T.json" \
    > "$OUT/long_T$T.log" 2>&1 || echo "T=$T rc=$?"
  grep "^|" "$OUT/long_T$T.log" | tail -n 8
done
python3 - "$OUT" <<'PY'
import glob, json, os, re, sys
rows = {}
# long_T<T>.json holds every preset's row (train_step.py also writes long_T<T>.<preset>.json)
files = {int(m.group(1)): p for p in glob.glob(os.path.join(sys.argv[1], "long_T*.json"))
        if (m := re.fullmatch(r"long_T(\d+)\.json", os.path.basename(p)))}
for T, path in sorted(files.items()):
  for r in json.load(open(path)):
    rows.setdefault(r["preset"].split(" (")[0], {})[T] = r
lengths = sorted({T for by_T in rows.values() for T in by_T})
print("\ntokens/s (peak GiB), B=1\n| model | " + " | ".join(f"T={T:,}" for T in lengths) + " |")
print("|---|" + "---|" * len(lengths))
for name, by_T in rows.items():
  cells = [("error" if "error" in by_T[T] else f"{by_T[T]['tokens_per_s'] / 1e3:.1f}k ({by_T[T].get('peak_GiB') or 0:.0f})")
           if T in by_T else "-" for T in lengths]
  print(f"| {name} | " + " | ".join(cells) + " |")
PY
