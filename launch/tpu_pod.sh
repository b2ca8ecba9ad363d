#!/usr/bin/env bash
# Train on a Cloud TPU pod slice: installs lineax_lm on every host and starts the same command on all
# of them (jax.distributed.initialize() picks up the TPU environment; the mesh spans every chip).
#
#   TPU_NAME=my-v5p-64 ZONE=us-east5-a CONFIG=configs/quickstart.py:gdn WORKDIR=gs://bucket/runs/x \
#     bash launch/tpu_pod.sh [--config.train.steps=10000 ...]
#
# WORKDIR should be a GCS path (Orbax writes checkpoints there from all hosts). Rerunning the same
# command resumes from the latest checkpoint; a preempted slice saves on SIGTERM.
set -euo pipefail
: "${TPU_NAME:?set TPU_NAME}" "${ZONE:?set ZONE}" "${CONFIG:?set CONFIG}" "${WORKDIR:?set WORKDIR}"
REPO=${REPO:-$(git config --get remote.origin.url || echo "")}
BRANCH=${BRANCH:-main}
EXTRA_ARGS="$*"
gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone "$ZONE" --worker=all --command "
  set -e
  if [ ! -d lineax_lm ]; then git clone --branch $BRANCH $REPO lineax_lm; fi
  cd lineax_lm && git pull --ff-only
  python3 -m venv .venv && .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q -e '.[tpu]'
  .venv/bin/python -m lineax_lm.train --config $CONFIG --workdir $WORKDIR $EXTRA_ARGS
"
