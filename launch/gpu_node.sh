#!/usr/bin/env bash
# Train on GPU nodes: 1-8 GPUs of one node in one process (the mesh's data axis spans them), or
# several nodes (one process per node) under SLURM or with an explicit coordinator.
#
#   CONFIG=configs/quickstart.py:hybrid WORKDIR=runs/hybrid bash launch/gpu_node.sh [options] [--config.key=value ...]
#
# Options:
#   --gpus N              use the first N GPUs of the node (CUDA_VISIBLE_DEVICES=0..N-1; default all)
#   --nodes N --node-rank R --coordinator HOST:PORT
#                         several nodes without SLURM: run the same command on every node, R = 0..N-1,
#                         HOST = node 0's address (sets JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES /
#                         JAX_PROCESS_ID, which lineax_lm.train.distributed joins)
#   --slurm               several nodes under SLURM: `sbatch --nodes=N --ntasks-per-node=1 --wrap
#                         "bash launch/gpu_node.sh --slurm"` (each task's process joins through SLURM's
#                         variables; the command runs under srun)
#   --detach              run in the background (nohup), output in $WORKDIR.log (local workdir) or
#                         $LOG; prints the pid
#   --dry-run             print the commands instead of running them
#
# Environment: CONFIG, WORKDIR (required; WORKDIR may be gs://...), PYTHON (an interpreter >= 3.11;
# default: the first of python3.13 python3.12 python3.11 python3 that is), VENV (default .venv; "none":
# use $PYTHON with lineax_lm already importable, e.g. on a machine without network), CUDA (12 or
# 13: which jax CUDA wheels to install; default from nvidia-smi), LOG.
# Rerunning the same command resumes from the workdir's latest checkpoint.
set -euo pipefail
cd "$(dirname "$0")/.."

DRY_RUN=0 DETACH=0 SLURM=0 GPUS="" NODES="" NODE_RANK="" COORDINATOR=""
TRAIN_ARGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY_RUN=1 ;;
    --detach) DETACH=1 ;;
    --slurm) SLURM=1 ;;
    --gpus) GPUS=${2:?--gpus needs a number}; shift ;;
    --nodes) NODES=${2:?--nodes needs a number}; shift ;;
    --node-rank) NODE_RANK=${2:?--node-rank needs a number}; shift ;;
    --coordinator) COORDINATOR=${2:?--coordinator needs HOST:PORT}; shift ;;
    -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
    *) TRAIN_ARGS+=("$1") ;;
  esac
  shift
done
: "${CONFIG:?set CONFIG (e.g. configs/quickstart.py:gdn)}" "${WORKDIR:?set WORKDIR (local or gs://...)}"

die() { echo "gpu_node.sh: $*" >&2; exit 2; }
run() {  # prints the command under --dry-run, runs it otherwise
  if [ "$DRY_RUN" = 1 ]; then printf '+'; printf ' %q' "$@"; printf '\n'; else "$@"; fi
}

if [ -n "$GPUS" ]; then
  [[ "$GPUS" =~ ^[1-8]$ ]] || die "--gpus must be 1..8; got $GPUS"
  CUDA_VISIBLE_DEVICES=$(seq -s, 0 $((GPUS - 1)))
  export CUDA_VISIBLE_DEVICES
fi
if [ -n "$NODES$NODE_RANK$COORDINATOR" ]; then
  if [ -z "$NODES" ] || [ -z "$NODE_RANK" ] || [ -z "$COORDINATOR" ]; then
    die "several nodes need all of --nodes, --node-rank and --coordinator"
  fi
  if ! [[ "$NODES" =~ ^[0-9]+$ && "$NODE_RANK" =~ ^[0-9]+$ ]] || [ "$NODE_RANK" -ge "$NODES" ]; then
    die "--node-rank must be in 0..$((NODES - 1)); got $NODE_RANK"
  fi
  [[ "$COORDINATOR" == *:* ]] || die "--coordinator must be HOST:PORT; got $COORDINATOR"
  export JAX_COORDINATOR_ADDRESS=$COORDINATOR JAX_NUM_PROCESSES=$NODES JAX_PROCESS_ID=$NODE_RANK
fi

# An interpreter >= 3.11 (the project's floor).
py_ok() { "$1" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; }
if [ -z "${PYTHON:-}" ]; then
  for candidate in python3.13 python3.12 python3.11 python3; do
    if command -v "$candidate" >/dev/null && py_ok "$candidate"; then PYTHON=$candidate; break; fi
  done
fi
if [ -z "${PYTHON:-}" ] || ! py_ok "$PYTHON"; then
  die "needs Python >= 3.11 (found: $(python3 --version 2>&1 || echo none)); set PYTHON=/path/to/python3.11+"
fi

VENV=${VENV:-.venv}
if [ "$VENV" = none ]; then
  PY=$PYTHON
else
  PY=$VENV/bin/python
  if [ ! -x "$PY" ] || [ "$DRY_RUN" = 1 ]; then
    if [ -z "${CUDA:-}" ]; then
      CUDA=$({ nvidia-smi 2>/dev/null || true; } | sed -n 's/.*CUDA Version: \([0-9]*\).*/\1/p' | head -1)
      CUDA=${CUDA:-13}
    fi
    [ "$CUDA" = 12 ] || [ "$CUDA" = 13 ] || die "CUDA must be 12 or 13; got $CUDA"
    run "$PYTHON" -m venv "$VENV"
    run "$PY" -m pip install -q --upgrade pip
    run "$PY" -m pip install -q -e ".[cuda$CUDA]"
  fi
fi

export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.92}
CMD=("$PY" -m lineax_lm.train --config "$CONFIG" --workdir "$WORKDIR" "${TRAIN_ARGS[@]}")
if [ "$SLURM" = 1 ]; then
  [ -n "${SLURM_JOB_ID:-}" ] || die "--slurm: not inside a SLURM allocation (no SLURM_JOB_ID)"
  CMD=(srun --ntasks-per-node=1 "${CMD[@]}")
fi
[ "$DRY_RUN" = 1 ] && [ -n "${JAX_COORDINATOR_ADDRESS:-}" ] &&
  echo "+ export JAX_COORDINATOR_ADDRESS=$JAX_COORDINATOR_ADDRESS JAX_NUM_PROCESSES=$JAX_NUM_PROCESSES JAX_PROCESS_ID=$JAX_PROCESS_ID"
[ "$DRY_RUN" = 1 ] && [ -n "${CUDA_VISIBLE_DEVICES:-}" ] && echo "+ export CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES"
if [ "$DETACH" = 1 ]; then
  case "$WORKDIR" in *://*) LOG=${LOG:-lineax_train.log} ;; *) LOG=${LOG:-${WORKDIR%/}.log} ;; esac
  if [ "$DRY_RUN" = 1 ]; then
    printf '+ nohup'; printf ' %q' "${CMD[@]}"; printf ' >> %q 2>&1 &\n' "$LOG"
  else
    mkdir -p "$(dirname "$LOG")"
    nohup "${CMD[@]}" >> "$LOG" 2>&1 &
    echo "training in the background: pid $!, log $LOG (rerun the same command to resume)"
  fi
else
  if [ "$DRY_RUN" = 1 ]; then run "${CMD[@]}"; else exec "${CMD[@]}"; fi
fi
