# Sourced by the GPU host's scripts (launch/distill_h200.sh, launch/hybrid_study_h200.sh,
# benchmarks/h200.sh): the host has jax, flax, optax, orbax and torch but not the rest of what
# lineax_lm imports, and no network. Each module it cannot import is installed into /tmp/site from
# .whl/ (git-ignored: bring it along; Python 3.12 wheels of the versions `make install` resolves,
# `pip download --only-binary=:all: --no-deps --python-version 3.12 --platform manylinux_2_28_x86_64
# --platform manylinux2014_x86_64 NAME==VERSION`: without the 2_28 tag pip falls back to an older
# grain, 0.2.13, which imports dm-tree and more-itertools besides).
#   install_missing_wheels [module:wheel ...]   the modules beyond LINEAX_MODULES (e.g. the tests')
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
