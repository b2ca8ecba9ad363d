#!/usr/bin/env bash
# Train on a Cloud TPU VM slice: create it (or reuse it), install lineax_lm on every host, and start
# the same training command on all of them in the background (jax.distributed.initialize() reads the
# slice from the TPU metadata; the mesh spans every chip). The run survives a dropped ssh connection;
# rerunning the same command resumes from the workdir's latest checkpoint (a run still alive is left
# alone), and a preempted slice saves one common step on SIGTERM.
#
#   TPU_NAME=my-v5p-64 ZONE=us-east5-a REPO=https://github.com/you/lineax_lm.git \
#   CONFIG=configs/quickstart.py:gdn WORKDIR=gs://bucket/runs/x \
#     bash launch/tpu_pod.sh [--dry-run] [--skip-aot-check] [--logs | --stop] [--config.key=value ...]
#
# Environment: TPU_NAME, ZONE, CONFIG, WORKDIR (gs://...: every host writes its part of the
# checkpoints there), REPO (a git URL the TPU hosts can clone; default: this checkout's origin when
# that is a network URL), BRANCH (default: main), PROJECT (default: gcloud's), ACCELERATOR and
# VERSION (e.g. v5p-64 and v2-alpha-tpuv5: create the slice when it does not exist; without them a
# missing slice is an error), SPOT=1 (a spot slice), LOG (on each host; default ~/lineax_train.log).
# --logs: the last lines of worker 0's log; --stop: end the run on every host (it saves first);
# --dry-run: print the gcloud commands and the script each host runs.
# Before it creates or uses the slice, the train step is compiled here for the slice's topology
# (python -m lineax_lm.train --aot=ACCELERATOR, which needs libtpu: pip install -e '.[tpu_aot]'); a
# config that does not fit its chips stops the launch with the bytes and the settings that would.
# AOT_TOPOLOGY names the topology when ACCELERATOR is not set (default: the slice's own type);
# --skip-aot-check launches without the check.
set -euo pipefail
cd "$(dirname "$0")/.."

DRY_RUN=0 ACTION=train AOT_CHECK=1
TRAIN_ARGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY_RUN=1 ;;
    --skip-aot-check) AOT_CHECK=0 ;;
    --logs) ACTION=logs ;;
    --stop) ACTION=stop ;;
    -h|--help) sed -n '2,26p' "$0"; exit 0 ;;
    *) TRAIN_ARGS+=("$1") ;;
  esac
  shift
done
die() { echo "tpu_pod.sh: $*" >&2; exit 2; }
: "${TPU_NAME:?set TPU_NAME}" "${ZONE:?set ZONE}"
BRANCH=${BRANCH:-main}
# shellcheck disable=SC2016  # $HOME expands on the TPU hosts, not here
LOG=${LOG:-'$HOME/lineax_train.log'}
# shellcheck disable=SC2016
PIDFILE='$HOME/lineax_train.pid'
GCLOUD=(gcloud compute tpus tpu-vm)
SCOPE=(--zone "$ZONE")
[ -n "${PROJECT:-}" ] && SCOPE+=(--project "$PROJECT")

run() {  # prints the command under --dry-run, runs it otherwise
  if [ "$DRY_RUN" = 1 ]; then printf '+'; printf ' %q' "$@"; printf '\n'; else "$@"; fi
}
on_workers() {  # on_workers WORKERS SCRIPT: runs SCRIPT on the slice's hosts over ssh
  if [ "$DRY_RUN" = 1 ]; then
    printf '+ %s ssh %q %s --worker=%s --command <<script\n%s\nscript\n' "${GCLOUD[*]}" "$TPU_NAME" \
      "${SCOPE[*]}" "$1" "$2"
  else
    "${GCLOUD[@]}" ssh "$TPU_NAME" "${SCOPE[@]}" --worker="$1" --command "$2"
  fi
}

if [ "$ACTION" = logs ]; then
  on_workers 0 "tail -n 50 $LOG"
  exit 0
fi
if [ "$ACTION" = stop ]; then  # SIGTERM: every host saves the same step, then exits
  on_workers all "if [ -f $PIDFILE ]; then kill -TERM \$(cat $PIDFILE) 2>/dev/null || true; fi"
  exit 0
fi

: "${CONFIG:?set CONFIG (e.g. configs/quickstart.py:gdn)}" "${WORKDIR:?set WORKDIR (gs://bucket/...)}"
case "$WORKDIR" in
  gs://*) ;;
  *) die "WORKDIR must be a gs:// path every host can reach; got $WORKDIR" ;;
esac
if [ -z "${REPO:-}" ]; then
  REPO=$(git config --get remote.origin.url 2>/dev/null || true)
  case "$REPO" in
    https://*|http://*|git@*|ssh://*) ;;
    *) die "set REPO to a git URL the TPU hosts can clone (this checkout's origin is '${REPO:-none}')" ;;
  esac
fi

# The step compiled for the slice's chips before any of them is rented or used.
if [ "$AOT_CHECK" = 1 ]; then
  TOPOLOGY=${AOT_TOPOLOGY:-${ACCELERATOR:-}}
  if [ -z "$TOPOLOGY" ] && [ "$DRY_RUN" = 0 ]; then
    TOPOLOGY=$("${GCLOUD[@]}" describe "$TPU_NAME" "${SCOPE[@]}" --format='value(acceleratorType)' \
               2>/dev/null || true)
  fi
  [ -n "$TOPOLOGY" ] || die "no topology for the compile check: set ACCELERATOR or AOT_TOPOLOGY (e.g. v5p-64), or pass --skip-aot-check"
  run "${PYTHON:-python3}" -m lineax_lm.train --config "$CONFIG" --aot="$TOPOLOGY" "${TRAIN_ARGS[@]}" \
    || die "the train step does not compile or fit on $TOPOLOGY (above); change the config, or pass --skip-aot-check"
fi

# Create the slice, or reuse the one that exists.
if [ "$DRY_RUN" = 1 ] || ! "${GCLOUD[@]}" describe "$TPU_NAME" "${SCOPE[@]}" >/dev/null 2>&1; then
  if [ -n "${ACCELERATOR:-}" ]; then
    CREATE=("${GCLOUD[@]}" create "$TPU_NAME" "${SCOPE[@]}" --accelerator-type "$ACCELERATOR"
            --version "${VERSION:?set VERSION, the TPU software version, e.g. v2-alpha-tpuv5}")
    [ "${SPOT:-0}" = 1 ] && CREATE+=(--spot)
    run "${CREATE[@]}"
  elif [ "$DRY_RUN" = 0 ]; then
    die "no TPU $TPU_NAME in $ZONE: create it, or set ACCELERATOR and VERSION to have this script create it"
  fi
fi

ARGS=$(printf ' %q' --config "$CONFIG" --workdir "$WORKDIR" "${TRAIN_ARGS[@]}")
# What each host runs: a Python >= 3.11, the checkout at $BRANCH, the venv, then the run, detached.
read -r -d '' SCRIPT <<EOF || true
set -e
PY=
for c in python3.13 python3.12 python3.11 python3; do
  if command -v \$c >/dev/null && \$c -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then PY=\$c; break; fi
done
if [ -z "\$PY" ]; then
  echo "lineax_lm needs Python >= 3.11 on the TPU host (found \$(python3 --version 2>&1)); use a newer TPU software VERSION or install python3.11" >&2
  exit 1
fi
if [ -f $PIDFILE ] && kill -0 \$(cat $PIDFILE) 2>/dev/null; then
  echo "\$(hostname): a run is still going (pid \$(cat $PIDFILE)); leaving it (--stop ends it)"
  exit 0
fi
if [ ! -d lineax_lm ]; then git clone --branch $(printf %q "$BRANCH") $(printf %q "$REPO") lineax_lm; fi
cd lineax_lm
git fetch -q origin $(printf %q "$BRANCH") && git checkout -q $(printf %q "$BRANCH") && git pull -q --ff-only
if [ ! -x .venv/bin/python ]; then \$PY -m venv .venv; .venv/bin/pip install -q --upgrade pip; fi
.venv/bin/pip install -q -e '.[tpu]'
nohup .venv/bin/python -m lineax_lm.train$ARGS >> $LOG 2>&1 &
echo \$! > $PIDFILE
echo "\$(hostname): training, pid \$!, log $LOG"
EOF
on_workers all "$SCRIPT"
[ "$DRY_RUN" = 1 ] || echo "started on every host of $TPU_NAME; follow it with: bash launch/tpu_pod.sh --logs"
