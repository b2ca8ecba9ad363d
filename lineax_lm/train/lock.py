"""One trainer per workdir: a lease file, `<workdir>/lineax_train.lock`, on local disk or gs://.

Two trainers in one workdir (a job re-submitted while the old one still runs) would interleave
their rows in one metrics.jsonl and race each other's checkpoint writes. The trainer holds a
`WorkdirLock` for its whole run: a JSON file naming the holder (host, pid, when it started) and a
heartbeat that a background thread renews every `heartbeat_s`. A second trainer refuses with a
message naming the holder. A lock whose holder is gone is taken over with a warning: on the same
host when its process no longer runs, on any host when its heartbeat is older than `stale_s`.

Object stores have no exclusive create, so a lease is taken by writing it and reading it back
`settle_s` later: of two trainers that both found the workdir free, the one whose write landed
last keeps the lock and the other refuses. `settle_s` only has to exceed the time one write takes.
A free local workdir is taken with an exclusive create, which needs no wait.
"""
from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid

import jax
import numpy as np

from lineax_lm import storage

log = logging.getLogger("lineax_lm")

LOCK_FILE = "lineax_train.lock"
_HELD_HERE: set[str] = set()  # the tokens of the locks this process holds


class WorkdirLocked(RuntimeError):
  """Another trainer holds the workdir."""


def _alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # another user's process
    return True
  return True


class WorkdirLock:
  """The lease of `workdir` (a context manager). Only process 0 of a multi-process run touches the
  file; every process learns whether it got the lock.

  heartbeat_s: how often the holder renews its heartbeat.
  stale_s: a heartbeat older than this means the holder is gone (whatever its host).
  settle_s: the wait between writing the lease and reading it back (default: 2 s on an object
    store, 0.2 s on local disk; a free local workdir needs none).
  """

  def __init__(self, workdir, *, heartbeat_s: float = 60.0, stale_s: float = 600.0,
               settle_s: float | None = None):
    if not stale_s > 2 * heartbeat_s:
      raise ValueError(f"stale_s={stale_s} must exceed twice heartbeat_s={heartbeat_s}: a live "
                       "holder's lock would otherwise look stale between two heartbeats")
    self.path = storage.as_path(workdir) / LOCK_FILE
    self.heartbeat_s, self.stale_s = heartbeat_s, stale_s
    self.settle_s = (2.0 if storage.is_remote(self.path) else 0.2) if settle_s is None else settle_s
    self.host, self.pid = socket.gethostname(), os.getpid()
    self.token = uuid.uuid4().hex
    self.started = time.time()
    self._stop = threading.Event()
    self._thread: threading.Thread | None = None

  # ---------------------------------------------------------------------------- the lease file
  def read(self) -> dict | None:
    """The lease as written, None when there is none. A file that is not a lease (torn by a crash
    mid-write, or edited) reads as a lease of nobody, with no heartbeat."""
    try:
      text = self.path.read_text()
    except FileNotFoundError:
      return None
    try:
      lease = json.loads(text)
      if isinstance(lease, dict):
        return lease
    except ValueError:
      pass
    return {"host": "?", "pid": -1, "heartbeat": 0.0, "token": ""}

  def _lease(self) -> dict:
    return {"host": self.host, "pid": self.pid, "token": self.token, "started": self.started,
            "heartbeat": time.time()}

  def _write(self):
    text = json.dumps(self._lease(), indent=1)
    if storage.is_remote(self.path):
      self.path.write_text(text)  # one object upload: readers see all of it or the old one
      return
    tmp = self.path.parent / f".{LOCK_FILE}.{self.token}"
    tmp.write_text(text)
    os.replace(tmp, self.path)

  def _create_local(self) -> bool:
    """Creates the lease exclusively (local disk); False when a lease exists."""
    try:
      fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
      return False
    with os.fdopen(fd, "w") as f:
      f.write(json.dumps(self._lease(), indent=1))
    return True

  def stale(self, lease: dict) -> str:
    """Why `lease`'s holder is gone ("" when it may still run)."""
    age = time.time() - float(lease.get("heartbeat", 0.0))
    if age > self.stale_s:
      return f"its last heartbeat was {age:.0f} s ago (more than {self.stale_s:.0f} s)"
    if lease.get("host") == self.host:
      pid = int(lease.get("pid", -1))
      if pid == self.pid and lease.get("token") not in _HELD_HERE:
        return f"it names pid {pid}, this process, which does not hold it (a restarted container reuses pids)"
      if pid != self.pid and not _alive(pid):
        return f"its process {pid} on this host no longer runs"
    return ""

  def describe(self, lease: dict) -> str:
    age = time.time() - float(lease.get("heartbeat", 0.0))
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(lease.get("started", 0.0))))
    return (f"pid {lease.get('pid')} on host {lease.get('host')} (running since {since}, last "
            f"heartbeat {age:.0f} s ago)")

  # ---------------------------------------------------------------------------- acquire / release
  def _try_acquire(self):
    """Takes the lease or raises WorkdirLocked naming its holder."""
    self.path.parent.mkdir(parents=True, exist_ok=True)
    if storage.is_local(self.path) and self._create_local():
      return
    lease = self.read()
    if lease is not None:
      why = self.stale(lease)
      if not why:
        same = lease.get("token") in _HELD_HERE
        raise WorkdirLocked(
            f"{self.path.parent} is in use by another trainer: {self.describe(lease)}"
            + (" (this very process)" if same else "")
            + f". Wait for it to finish or stop it; a lock whose holder died is taken over once "
            f"its process is gone (same host) or its heartbeat is {self.stale_s:.0f} s old. "
            f"The lock: {self.path}")
      log.warning("taking over the lock of %s from %s: %s", self.path.parent, self.describe(lease), why)
    self._write()
    time.sleep(self.settle_s)
    now = self.read()
    if now is None or now.get("token") != self.token:
      raise WorkdirLocked(f"{self.path.parent} was locked at the same moment by another trainer: "
                          f"{self.describe(now) if now else 'its lease is already gone'}. The lock: "
                          f"{self.path}")

  def acquire(self):
    error = None
    if jax.process_index() == 0:
      try:
        self._try_acquire()
      except WorkdirLocked as e:
        error = e
    if jax.process_count() > 1:
      from jax.experimental import multihost_utils
      got = multihost_utils.broadcast_one_to_all(np.int32(error is None))
      if not int(got) and error is None:
        error = WorkdirLocked(f"{self.path.parent} is in use by another trainer (see process 0's log)")
    if error is not None:
      raise error
    if jax.process_index() == 0:
      _HELD_HERE.add(self.token)
      self._thread = threading.Thread(target=self._beat, name="lineax-workdir-lock", daemon=True)
      self._thread.start()

  def _beat(self):
    while not self._stop.wait(self.heartbeat_s):
      lease = self.read()
      if lease is None or lease.get("token") != self.token:
        log.error("the lock of %s was taken over by %s: another trainer now writes into this "
                  "workdir", self.path.parent, self.describe(lease) if lease else "nobody (removed)")
        return
      try:
        self._write()
      except OSError as e:  # a transient store error: the next beat tries again
        log.warning("could not renew the lock %s: %s", self.path, e)

  def release(self):
    if self._thread is None:
      return
    self._stop.set()
    self._thread.join()
    self._thread = None
    _HELD_HERE.discard(self.token)
    lease = self.read()
    if lease is not None and lease.get("token") == self.token:
      self.path.unlink()

  def __enter__(self):
    self.acquire()
    return self

  def __exit__(self, *exc):
    self.release()
