"""Cluster detection from fake environments (explicit JAX variables, SLURM, TPU VMs, GKE), clear
errors for half-configured clusters, and the stop every process agrees on."""
import pytest

from lineax_lm.train import distributed

NO_TPU = lambda: False  # noqa: E731


def detect(env, tpu=NO_TPU):
  return distributed.detect_cluster(env, tpu)


def test_single_process_environments_need_no_cluster():
  assert detect({}) is None
  assert detect({"SLURM_JOB_ID": "7", "SLURM_NTASKS": "1"}) is None    # one task: nothing to join
  assert detect({"TPU_WORKER_HOSTNAMES": "10.0.0.2", "TPU_WORKER_ID": "0"}) is None  # one host
  assert detect({"TPU_SKIP_MDS_QUERY": "1"}) is None  # what `import jax` sets on any machine


def test_explicit_variables():
  c = detect({"JAX_COORDINATOR_ADDRESS": "10.0.0.2:1234", "JAX_NUM_PROCESSES": "2",
              "JAX_PROCESS_ID": "1", "JAX_LOCAL_DEVICE_IDS": "0,1"})
  assert c.kind == "explicit"
  assert c.kwargs == dict(coordinator_address="10.0.0.2:1234", num_processes=2, process_id=1,
                          local_device_ids=[0, 1])


@pytest.mark.parametrize("env, message", [
    ({"JAX_COORDINATOR_ADDRESS": "10.0.0.2:1234"}, "JAX_NUM_PROCESSES, JAX_PROCESS_ID not"),
    ({"JAX_COORDINATOR_ADDRESS": "h:1", "JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "2"}, r"in \[0, "),
    ({"JAX_COORDINATOR_ADDRESS": "h:1", "JAX_NUM_PROCESSES": "two", "JAX_PROCESS_ID": "0"}, "integers"),
    ({"JAX_COORDINATOR_ADDRESS": "h", "JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "0"}, "host:port"),
    ({"SLURM_JOB_ID": "7", "SLURM_NTASKS": "4"}, "srun"),
])
def test_half_configured_clusters_are_clear_errors(env, message):
  with pytest.raises(ValueError, match=message):
    detect(env)


def test_slurm_and_tpu_use_jax_auto_detection():
  c = detect({"SLURM_JOB_ID": "7", "SLURM_NTASKS": "4", "SLURM_PROCID": "3"})
  assert c.kind == "slurm" and c.kwargs == {} and "task 3 of 4" in c.description
  assert detect({}, tpu=lambda: True).kind == "tpu"          # a plain TPU VM: no variables at all
  gke = detect({"TPU_WORKER_HOSTNAMES": "a,b,c,d", "TPU_WORKER_ID": "2"})
  assert gke.kind == "tpu" and "4 hosts" in gke.description


def test_initialize_calls_jax_distributed_with_the_cluster():
  calls = []
  env = {"JAX_COORDINATOR_ADDRESS": "h:1", "JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "0"}
  assert distributed.initialize(env, NO_TPU, init=lambda **kw: calls.append(kw)).kind == "explicit"
  assert calls == [dict(coordinator_address="h:1", num_processes=2, process_id=0)]
  assert distributed.initialize({}, NO_TPU, init=lambda **kw: calls.append(kw)) is None
  assert len(calls) == 1


def test_every_process_stops_at_the_strongest_request():
  gather = lambda codes: (lambda mine: [mine, *codes])  # noqa: E731  this process + the others
  assert distributed.agree_on_stop(None, gather([0, 0])) is None
  assert distributed.agree_on_stop(None, gather([0, 2])) == "SIGTERM"   # another host was preempted
  assert distributed.agree_on_stop("SIGINT", gather([0])) == "SIGINT"
  assert distributed.agree_on_stop("SIGINT", gather([2])) == "SIGTERM"
  assert distributed.agree_on_stop("SIGTERM") == "SIGTERM"            # one process: its own
