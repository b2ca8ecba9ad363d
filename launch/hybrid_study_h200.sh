#!/bin/bash
# The hybrid-ratio study's grid on one H200 (docs/hybrid_study.md): every mixer x ratio cell plus
# the Transformer (lineax_lm.experiments.grid), on the corpus the repository ships, PARALLEL cells at
# a time on the one GPU (a small cell's 20M-parameter steps leave the GPU mostly idle: 1-3% MFU in
# results/hybrid_small_conv_recall's metrics).
#
#   bash launch/hybrid_study_h200.sh                   # rerun until it prints "grid complete"
#   ONLY=gla,transformer PARALLEL=4 bash launch/hybrid_study_h200.sh
#   SIZE=small_recall RESULTS_IN=results/hybrid_small_recall NEXT=4 PARALLEL=4 \
#     bash launch/hybrid_study_h200.sh                 # a call
#
# Run from the repository root on the GPU host (Python 3.12, jax, flax, optax, orbax preinstalled;
# .whl/ with the wheels of what it lacks, launch/h200_env.sh).
# Env (defaults in brackets):
#   SIZE [small] a size or recipe of lineax_lm.experiments.sizes (small, small_recall,
#   small_conv_recall, ...)   GRID_DIR [/tmp/keep/hybrid_$SIZE] (must survive between calls)
#   ONLY [every cell] cells as the grid's --only (mixer[:ratio][@seed],...)
#   NEXT [every unfinished cell] only the next NEXT unfinished cells: on a machine that is fresh
#   for every call, as many as PARALLEL and few enough to finish inside T_LIMIT (a `small` cell
#   shares the GPU: three DeltaNet cells at once took 460 s; four step at 0.24 s each, about
#   590 s with start and scoring)
#   PARALLEL [4] cells at a time (8 if their memory allows)   T_LIMIT [540] seconds before SIGTERM
#   (the running cells save; 30 s later they are killed)   RESULTS_IN [unset] the finished cells
#   of earlier calls, copied into GRID_DIR first (a fresh machine): a results archive (below) or a
#   folder of the same layout (results/hybrid_<size>, the committed cells, with the positive
#   control's control.json: the host has no teacher to score it)   GRID_ARGS [] more grid
#   flags (--config.train.log_every=40 ...; --population trains a cell's seeds as one program, one
#   process a cell: NEXT=6 PARALLEL=2 runs two cells of three seeds each; measured 1.22x a GDN 3:1
#   cell's tokens/s on an H100, and the Transformer's three seeds ran out of memory there, so the
#   seeds grids run without it: docs/hybrid_study.md)   MPS [unset] 1: the cells share the GPU
#   through CUDA MPS (start_mps in launch/h200_env.sh: four `small` cells stepped 1.26x faster
#   than as plain processes on one H100)
#   DETACH [unset] 1: the grid runs on after the call returns (T_LIMIT may then exceed a call),
#   watched by later calls on the same machine with WATCH=SECONDS, which bring back what has
#   finished (detach_or_watch in launch/h200_env.sh):
#     ONLY=gla NEXT=6 T_LIMIT=1150 MPS=1 DETACH=1 bash launch/hybrid_study_h200.sh
#     WATCH=540 bash launch/hybrid_study_h200.sh   # each later call, until it says it has ended
# Resumable: finished cells are skipped, an interrupted cell resumes from its checkpoint, and
# (JAX_COMPILATION_CACHE_DIR) compiled programs are reused while the machine stays up. With $OUT
# set: the log, tables.md, claims.md and grid_results.tgz (every finished cell's result.json and
# metrics, the tables and plots; give it back as RESULTS_IN on a fresh machine).
set -u
SIZE=${SIZE:-small}
GRID_DIR=${GRID_DIR:-/tmp/keep/hybrid_$SIZE}
case "$GRID_DIR" in /*) ;; *) GRID_DIR="$PWD/$GRID_DIR" ;; esac
mkdir -p "$GRID_DIR"
export JAX_COMPILATION_CACHE_DIR="$GRID_DIR/jax_cache"
source "$(dirname "$0")/h200_env.sh"

pack_results() {   # into $OUT: what is finished so far; prints how many cells that is
  if [ -n "${OUT:-}" ]; then
    (cd "$GRID_DIR" && tar czf "$OUT/grid_results.tgz" --ignore-failed-read tables.md claims.md \
      results.md control.json results.csv results.json ./*.png ./cells/*/result.json \
      ./cells/*/cell.log ./cells/*/run/metrics.jsonl 2>/dev/null)
    cp "$GRID_DIR"/tables.md "$GRID_DIR"/claims.md "$OUT"/ 2>/dev/null  # plots: in the archive
  fi
  echo "cells finished: $(find "$GRID_DIR/cells" -name result.json 2>/dev/null | wc -l)"
}

detach_or_watch "$GRID_DIR" pack_results
if [ -n "${RESULTS_IN:-}" ]; then take_results "$RESULTS_IN" "$GRID_DIR" || exit 2; fi
install_missing_wheels || exit 2
if [ -n "${MPS:-}" ]; then start_mps "$GRID_DIR/mps" || exit 2; fi
# shellcheck disable=SC2086  # GRID_ARGS is a list of flags
run_limited "$GRID_DIR/grid.log" "${T_LIMIT:-540}" python3 -m lineax_lm.experiments.grid \
  --size "$SIZE" --out "$GRID_DIR" ${ONLY:+--only "$ONLY"} ${NEXT:+--next "$NEXT"} \
  --parallel "${PARALLEL:-4}" ${GRID_ARGS:-}
stop_mps
pack_results
if [ "$rc" -eq 0 ]; then
  cat "$GRID_DIR/tables.md"; [ -z "${ONLY:-}${NEXT:-}" ] && echo "grid complete"
else
  grep -E "Interrupted|Error|stopped" "$GRID_DIR/grid.log" | tail -n 8
  echo "not finished (rc=$rc): rerun the same command to resume"
  [ -n "${OUT:-}" ] && echo "(the stopped cells' checkpoints stay in $GRID_DIR on this machine;" \
    "grid_results.tgz holds finished cells only, so a fresh machine trains them from the start)"
fi
exit "$rc"
