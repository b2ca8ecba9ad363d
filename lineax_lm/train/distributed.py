"""Multi-host runs: join the cluster when one is detectable, log from process 0, and agree on a stop.

`detect_cluster(env)` reads the environment a launcher leaves (nothing here asks the network):

  explicit   JAX_COORDINATOR_ADDRESS + JAX_NUM_PROCESSES + JAX_PROCESS_ID (all three, or an error
             naming the missing ones); JAX_LOCAL_DEVICE_IDS optional (one process per GPU)
  slurm      SLURM_JOB_ID with more than one task (SLURM_NTASKS / SLURM_STEP_NUM_TASKS); each task
             must be an srun step (SLURM_PROCID): a multi-task allocation entered without srun is
             an error, as jax.distributed would wait for tasks that never start
  tpu        a Cloud TPU VM (/dev/accel* or /dev/vfio devices, or the TPU_* variables GKE and the TPU
             runtime set): jax.distributed.initialize() reads the slice's hosts from the TPU
             metadata; a slice that names a single worker (TPU_WORKER_HOSTNAMES) needs no cluster
  None       one process: nothing to join

`initialize()` joins the detected cluster (once, before any JAX computation). `agree_on_stop` makes a
SIGTERM / SIGINT seen by any process stop every process at the same step (the checkpoint of that
step is then one state written by all hosts).
"""
from __future__ import annotations

import dataclasses
import glob
import logging
import os
from typing import Callable, Mapping

log = logging.getLogger("lineax_lm")

JAX_VARS = ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID")
# What GKE and multislice set on TPU hosts. Not TPU_SKIP_MDS_QUERY: importing jax sets it anywhere.
TPU_VARS = ("TPU_WORKER_HOSTNAMES", "TPU_WORKER_ID", "MEGASCALE_COORDINATOR_ADDRESS")
STOP_SIGNALS = (None, "SIGINT", "SIGTERM")  # agree_on_stop's order: the strongest request wins


@dataclasses.dataclass(frozen=True)
class Cluster:
  kind: str                      # "explicit" | "slurm" | "tpu"
  kwargs: dict                   # for jax.distributed.initialize (empty: its own auto-detection)
  description: str


def _tpu_devices_present() -> bool:
  return bool(glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"))


def detect_cluster(env: Mapping[str, str] | None = None,
                   tpu_devices_present: Callable[[], bool] = _tpu_devices_present) -> Cluster | None:
  """The cluster this process belongs to, or None for a single process (see the module docstring).
  Raises ValueError for a half-configured one, naming what is missing."""
  env = os.environ if env is None else env
  given = [v for v in JAX_VARS if env.get(v)]
  if given:
    missing = [v for v in JAX_VARS if not env.get(v)]
    if missing:
      raise ValueError(f"multi-host: {', '.join(given)} set but {', '.join(missing)} not: set all of "
                       f"{', '.join(JAX_VARS)} (the coordinator's host:port, the number of processes, "
                       "this process's index), or none of them")
    try:
      num, pid = int(env["JAX_NUM_PROCESSES"]), int(env["JAX_PROCESS_ID"])
    except ValueError:
      raise ValueError(f"multi-host: JAX_NUM_PROCESSES={env['JAX_NUM_PROCESSES']!r} and "
                       f"JAX_PROCESS_ID={env['JAX_PROCESS_ID']!r} must be integers") from None
    if num < 1 or not 0 <= pid < num:
      raise ValueError(f"multi-host: JAX_PROCESS_ID={pid} must be in [0, JAX_NUM_PROCESSES={num})")
    if ":" not in env["JAX_COORDINATOR_ADDRESS"]:
      raise ValueError(f"multi-host: JAX_COORDINATOR_ADDRESS={env['JAX_COORDINATOR_ADDRESS']!r} must "
                       "be host:port (process 0's address and a free port, e.g. 10.0.0.2:1234)")
    kwargs = dict(coordinator_address=env["JAX_COORDINATOR_ADDRESS"], num_processes=num, process_id=pid)
    if env.get("JAX_LOCAL_DEVICE_IDS"):
      kwargs["local_device_ids"] = [int(i) for i in env["JAX_LOCAL_DEVICE_IDS"].split(",")]
    return Cluster("explicit", kwargs, f"process {pid} of {num}, coordinator {kwargs['coordinator_address']}")
  if env.get("SLURM_JOB_ID"):
    tasks = env.get("SLURM_STEP_NUM_TASKS") or env.get("SLURM_NTASKS") or "1"
    if int(tasks) > 1:
      if not env.get("SLURM_PROCID"):
        raise ValueError(f"multi-host: a SLURM allocation of {tasks} tasks, but this process is not "
                         "an srun task (no SLURM_PROCID): start the command with `srun`")
      return Cluster("slurm", {}, f"SLURM task {env['SLURM_PROCID']} of {tasks}")
  tpu_env = [v for v in TPU_VARS if env.get(v)]
  if tpu_env or tpu_devices_present():
    hosts = [h for h in env.get("TPU_WORKER_HOSTNAMES", "").split(",") if h]
    if len(hosts) == 1 and not env.get("MEGASCALE_COORDINATOR_ADDRESS"):
      return None
    return Cluster("tpu", {}, "TPU slice" + (f" of {len(hosts)} hosts" if hosts else
                                             " (hosts from the TPU metadata)"))
  return None


def initialize(env: Mapping[str, str] | None = None, tpu_devices_present=_tpu_devices_present,
               init: Callable | None = None) -> Cluster | None:
  """Joins the detected cluster (jax.distributed.initialize; `init` stands in for it in tests) and
  quiets the lineax_lm logger on every process but 0. Returns the cluster, or None."""
  cluster = detect_cluster(env, tpu_devices_present)
  if cluster is not None:
    if init is None:
      import jax
      init = jax.distributed.initialize
    init(**cluster.kwargs)
  import jax
  process = jax.process_index()
  logging.getLogger("lineax_lm").setLevel(logging.INFO if process == 0 else logging.WARNING)
  if cluster is not None:
    log.info("joined the cluster: %s", cluster.description)
  return cluster


def agree_on_stop(requested: str | None, allgather: Callable | None = None) -> str | None:
  """The stop request every process acts on at this step: the strongest of all processes' local
  requests (SIGTERM over SIGINT over none), so that all of them save the same step and exit. One
  process: its own request. `allgather` (int32 scalar -> array of every process's) stands in for
  multihost_utils.process_allgather in tests."""
  import jax
  if allgather is None:
    if jax.process_count() == 1:
      return requested
    import numpy as np
    from jax.experimental import multihost_utils
    allgather = lambda x: multihost_utils.process_allgather(np.int32(x))  # noqa: E731
  code = int(max(allgather(STOP_SIGNALS.index(requested))))
  return STOP_SIGNALS[code]
