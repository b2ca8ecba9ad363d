#!/bin/bash
# Long-context training on one GPU: B=1 at T = 32,768, 65,536 and 131,072 (the same model trained on
# ever longer rows), for the 340M Gated DeltaNet (its linear ops whole and on segments of T), its 3:1
# hybrid and the Transformer preset (cuDNN flash attention), with fla's GatedDeltaNet and HF's Llama
# from the same call: where attention's quadratic cost takes over, and whether we stay ahead of fla.
#   LENGTHS=65536 bash benchmarks/long_context.sh    # one length: one device call (<= 600 s)
#   bash benchmarks/long_context.sh                  # every length (a host without a time limit)
# Env: LENGTHS (space-separated T), PRESETS (train_step.py --presets), REMAT_ABOVE (T above which
#      both sides recompute each layer's activations in the backward: remat="full" here, gradient
#      checkpointing for the torch models; default 65536), T_LIMIT (seconds per length), STEPS.
# Each length is one train_step.py call (each preset in a process of its own, torch first), its
# rows in $OUT/long_T<T>.json; the table at the end puts every length side by side.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
source "$(dirname "$0")/../launch/h200_env.sh"
# fla 0.6.0 (module fla, from the fla-core wheel) and einops travel in .whl/ with the rest
install_missing_wheels fla:fla_core einops:einops || exit 2
PRESETS=${PRESETS:-gated_deltanet_340m_fla,gated_deltanet_340m_fla@auto,gated_deltanet_340m_fla:3:1,transformer_340m}
for T in ${LENGTHS:-32768 65536 131072}; do
  remat=none; [ "$T" -gt "${REMAT_ABOVE:-65536}" ] && remat=full
  echo "== T=$T remat=$remat"
  timeout -k 30 "${T_LIMIT:-560}" python3 benchmarks/train_step.py --run_torch --batch 1 --seq "$T" \
    --remat "$remat" --steps "${STEPS:-3}" --presets "$PRESETS" --json "$OUT/long_T$T.json" \
    > "$OUT/long_T$T.log" 2>&1 || echo "T=$T rc=$?"
  grep "^|" "$OUT/long_T$T.log" | tail -n 8
done
python3 - "$OUT" <<'PY'
import glob, json, os, sys
rows = {}
for path in sorted(glob.glob(os.path.join(sys.argv[1], "long_T*.json")), key=lambda p: int(p.split("_T")[-1][:-5])):
  T = int(path.split("_T")[-1][:-5])
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
