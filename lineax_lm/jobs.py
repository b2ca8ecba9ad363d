"""Runs several commands at a time, each in its own process, passing SIGTERM on to them.

The linearization study (`lineax_lm.distill.study --parallel N`) and the hybrid grid
(`lineax_lm.experiments.grid --parallel N`) run one student or cell per process: a run of theirs is
mostly XLA compilation on the host's CPUs and little device time, so N of them share one GPU well.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import subprocess
import time
from typing import Callable


class Stopped(Exception):
  """SIGTERM or SIGINT arrived: nothing new was started, and the running jobs have exited."""

  def __init__(self, signum: int):
    super().__init__(f"stopped by {signal.Signals(signum).name}")
    self.signum = signum


def run_parallel(jobs: dict[str, list[str]], parallel: int, log_path: Callable[[str], str],
                 *, echo: Callable[[str], None] = lambda line: print(line, flush=True)) -> list[str]:
  """Runs `jobs` (name -> argv), at most `parallel` at a time in job order, each one's stdout and
  stderr appended to `log_path(name)`. Returns the names of the jobs that exited non-zero.

  SIGTERM is passed on to the running jobs (they save and stop; a trainer does), and then Stopped
  is raised once they have exited. SIGINT is not passed on: Ctrl-C reaches the whole process group
  already, and a second SIGINT would stop a trainer unsaved.
  """
  if parallel < 1:
    raise ValueError(f"parallel: must be >= 1; got {parallel}")
  running: dict[str, tuple[subprocess.Popen, float]] = {}
  stopped: list[int] = []

  def forward(signum, frame):
    stopped.append(signum)
    if signum == signal.SIGTERM:
      for proc, _ in running.values():
        proc.send_signal(signum)

  previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
  failed = []
  try:
    queue = list(jobs)
    while queue or running:
      while queue and len(running) < parallel and not stopped:
        name = queue.pop(0)
        with open(log_path(name), "a", encoding="utf-8") as log:  # the child keeps its own copy
          running[name] = (subprocess.Popen(jobs[name], stdout=log, stderr=subprocess.STDOUT),
                           time.perf_counter())
        echo(f"{name}: started ({len(running)} running, {len(queue)} waiting)")
      time.sleep(0.2)   # a finished job's slot is refilled within this
      for name, (proc, start) in list(running.items()):
        if proc.poll() is None:
          continue
        del running[name]
        state = "finished" if proc.returncode == 0 else f"stopped (rc={proc.returncode})"
        echo(f"{name}: {state} after {time.perf_counter() - start:.0f} s (log: {log_path(name)})")
        if proc.returncode != 0:
          failed.append(name)
      if stopped:
        queue.clear()
  finally:
    for s, handler in previous.items():
      signal.signal(s, handler)
  if stopped:
    raise Stopped(stopped[0])
  return failed


@contextlib.contextmanager
def one_at_a_time(lock_path: str):
  """Holds an exclusive lock on `lock_path` (made if missing) for the block: of the processes that
  enter it with the same path, one runs it at a time, the others wait their turn. The lock goes
  with the process (flock), so a job killed inside the block does not leave it held."""
  os.makedirs(os.path.dirname(os.path.abspath(lock_path)), exist_ok=True)
  with open(lock_path, "a") as f:
    fcntl.flock(f, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(f, fcntl.LOCK_UN)


def without_flags(argv: list[str], flags: tuple[str, ...]) -> list[str]:
  """argv without the given flags and their values (`--flag value` or `--flag=value`): a parent's
  command line for its children, which get their own `--only`."""
  out, skip = [], False
  for a in argv:
    if skip:
      skip = False
    elif a in flags:
      skip = True
    elif not any(a.startswith(f + "=") for f in flags):
      out.append(a)
  return out
