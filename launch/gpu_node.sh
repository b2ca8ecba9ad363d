#!/usr/bin/env bash
# Train on one GPU node (all of its GPUs in one process: the mesh's data axis spans them).
#
#   CONFIG=configs/quickstart.py:hybrid WORKDIR=runs/hybrid bash launch/gpu_node.sh [--config.key=value ...]
#
# Uses the Pallas GPU kernels (backend "auto") and bf16 activations when the config asks for them
# (--config.model.dtype=bfloat16). Rerun the same command to resume. For several nodes, run this on
# each with JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and JAX_PROCESS_ID set (then
# jax.distributed.initialize() joins them).
set -euo pipefail
: "${CONFIG:?set CONFIG}" "${WORKDIR:?set WORKDIR}"
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q -e ".[gpu]"
fi
export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.92}
exec .venv/bin/python -m lineax_lm.train --config "$CONFIG" --workdir "$WORKDIR" "$@"
