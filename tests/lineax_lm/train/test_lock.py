"""One trainer per workdir (lineax_lm.train.lock): a second trainer refuses naming the holder, a
lock whose holder is gone (dead process, old heartbeat, torn file) is taken over with a warning, on
local disk and on gs:// (the fake GCS of tests/lineax_lm/fake_gcs.py)."""
import json
import logging
import os
import socket
import subprocess
import sys
import time

import pytest

from lineax_lm.train.lock import LOCK_FILE, WorkdirLock, WorkdirLocked
from lineax_lm.train.trainer import train_and_evaluate
from tests.lineax_lm.fake_gcs import fake_gcs
from tests.lineax_lm.train.test_trainer import tiny_config

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
HOLDER = """
import sys, time
from lineax_lm.train.lock import WorkdirLock
WorkdirLock(sys.argv[1]).acquire()
print("held", flush=True)
time.sleep(120)
"""


def _lease(workdir, **fields):
  os.makedirs(workdir, exist_ok=True)
  lease = {"host": socket.gethostname(), "pid": os.getpid(), "token": "someone", "started": time.time(),
           "heartbeat": time.time(), **fields}
  with open(os.path.join(workdir, LOCK_FILE), "w") as f:
    json.dump(lease, f)


def test_a_second_trainer_refuses_naming_the_holder_and_takes_over_once_it_is_killed(tmp_path, caplog):
  workdir = str(tmp_path / "run")
  holder = subprocess.Popen([sys.executable, "-c", HOLDER, workdir], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"})
  try:
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(WorkdirLocked, match=rf"run is in use by another trainer: pid {holder.pid} on "
                                            rf"host {socket.gethostname()} \(running since .*, last "
                                            r"heartbeat \d+ s ago\)"):
      train_and_evaluate(tiny_config(), workdir)
    assert not os.path.exists(os.path.join(workdir, "metrics.jsonl"))  # it wrote nothing
  finally:
    holder.kill()  # kill -9: no release, the lease stays behind
    holder.wait()
  with caplog.at_level(logging.WARNING, logger="lineax_lm"), WorkdirLock(workdir, settle_s=0) as lock:
    assert json.loads(lock.path.read_text())["pid"] == os.getpid()
  assert f"taking over the lock of {workdir} from pid {holder.pid}" in caplog.text
  assert f"its process {holder.pid} on this host no longer runs" in caplog.text
  assert not os.path.exists(os.path.join(workdir, LOCK_FILE))  # released


def test_another_hosts_lock_is_kept_while_its_heartbeat_is_fresh(tmp_path, caplog):
  workdir = str(tmp_path / "run")
  _lease(workdir, host="elsewhere", pid=1, heartbeat=time.time() - 30)
  with pytest.raises(WorkdirLocked, match=r"pid 1 on host elsewhere .*last heartbeat 30 s ago"):
    WorkdirLock(workdir, settle_s=0).acquire()
  _lease(workdir, host="elsewhere", pid=1, heartbeat=time.time() - 700)
  with caplog.at_level(logging.WARNING, logger="lineax_lm"), WorkdirLock(workdir, settle_s=0):
    pass
  assert "its last heartbeat was 700 s ago (more than 600 s)" in caplog.text


def test_a_torn_lock_file_is_taken_over(tmp_path):
  workdir = tmp_path / "run"
  workdir.mkdir()
  (workdir / LOCK_FILE).write_text('{"host": "a", "pi')
  with WorkdirLock(str(workdir), settle_s=0) as lock:
    assert lock.read()["token"] == lock.token


def test_the_same_process_cannot_train_twice_in_one_workdir(tmp_path):
  with WorkdirLock(str(tmp_path), settle_s=0):
    with pytest.raises(WorkdirLocked, match=r"\(this very process\)"):
      WorkdirLock(str(tmp_path), settle_s=0).acquire()
  # a lease naming this pid that this process does not hold: a restarted container's pids
  _lease(str(tmp_path))
  with WorkdirLock(str(tmp_path), settle_s=0):
    pass


def test_the_holder_renews_its_heartbeat(tmp_path):
  with WorkdirLock(str(tmp_path), heartbeat_s=0.05, stale_s=1.0, settle_s=0) as lock:
    first = lock.read()["heartbeat"]
    time.sleep(0.3)
    assert lock.read()["heartbeat"] > first


def test_of_two_trainers_that_found_the_workdir_free_the_last_writer_keeps_it(tmp_path, monkeypatch):
  first, second = WorkdirLock(str(tmp_path), settle_s=0), WorkdirLock(str(tmp_path), settle_s=0)
  monkeypatch.setattr(first, "_create_local", lambda: False)  # as on an object store
  monkeypatch.setattr(time, "sleep", lambda s: second._write())  # lands while the first waits
  with pytest.raises(WorkdirLocked, match=r"locked at the same moment by another trainer"):
    first.acquire()
  assert first.read()["token"] == second.token


def test_lock_on_gcs(tmp_path, monkeypatch, caplog):
  bucket = fake_gcs(tmp_path / "gcs", monkeypatch)
  workdir = "gs://b/runs/x"
  with WorkdirLock(workdir, settle_s=0.01) as lock:
    assert os.path.exists(os.path.join(bucket(workdir), LOCK_FILE))
    with pytest.raises(WorkdirLocked, match=r"gs://b/runs/x is in use by another trainer"):
      WorkdirLock(workdir, settle_s=0.01).acquire()
    assert lock.read()["token"] == lock.token
  assert not os.path.exists(os.path.join(bucket(workdir), LOCK_FILE))
  _lease(bucket(workdir), host="elsewhere", heartbeat=time.time() - 1000)
  with caplog.at_level(logging.WARNING, logger="lineax_lm"), WorkdirLock(workdir, settle_s=0.01):
    pass
  assert "taking over the lock of gs://b/runs/x" in caplog.text
