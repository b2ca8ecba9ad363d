"""lineax_lm.jobs: commands a few at a time in their own processes, SIGTERM passed on to them."""
import os
import signal
import sys
import threading

import pytest

from lineax_lm import jobs


def test_jobs_run_at_most_parallel_at_a_time_and_failures_are_named(tmp_path):
  # Each job records when it started and ended; two at a time means no three overlap.
  script = ("import sys, time; open(sys.argv[1], 'a').write(f'{time.time()} start\\n'); "
            "time.sleep(0.5); open(sys.argv[1], 'a').write(f'{time.time()} end\\n'); "
            "sys.exit(int(sys.argv[2]))")
  stamps = str(tmp_path / "stamps")
  commands = {f"job{i}": [sys.executable, "-c", script, stamps, str(int(i == 1))] for i in range(3)}
  lines = []
  failed = jobs.run_parallel(commands, 2, lambda name: str(tmp_path / f"{name}.log"), echo=lines.append)
  assert failed == ["job1"]
  events = sorted((float(t), kind) for t, kind in (line.split() for line in open(stamps)))
  depth = peak = 0
  for _, kind in events:
    depth += 1 if kind == "start" else -1
    peak = max(peak, depth)
  assert peak == 2
  assert any(line.startswith("job1: stopped (rc=1)") for line in lines)
  assert all(os.path.exists(tmp_path / f"job{i}.log") for i in range(3))
  with pytest.raises(ValueError, match="parallel"):
    jobs.run_parallel(commands, 0, str)


def test_one_at_a_time_runs_the_blocks_of_several_processes_in_turn(tmp_path):
  # Three jobs run at once, each recording when its locked block starts and ends: the blocks never
  # overlap; a job killed inside the block leaves the lock free (flock goes with the process).
  script = ("import sys, time; from lineax_lm import jobs\n"
            "with jobs.one_at_a_time(sys.argv[2]):\n"
            "  open(sys.argv[1], 'a').write(f'{time.time()} start\\n'); time.sleep(0.3)\n"
            "  open(sys.argv[1], 'a').write(f'{time.time()} end\\n')\n"
            "  if sys.argv[3] == '1': import os; os._exit(3)\n")
  stamps, lock = str(tmp_path / "stamps"), str(tmp_path / "out" / ".lock")
  commands = {f"job{i}": [sys.executable, "-c", script, stamps, lock, str(int(i == 0))]
              for i in range(3)}
  failed = jobs.run_parallel(commands, 3, lambda name: str(tmp_path / f"{name}.log"),
                             echo=lambda line: None)
  assert failed == ["job0"]
  events = sorted((float(t), kind) for t, kind in (line.split() for line in open(stamps)))
  assert [kind for _, kind in events] == ["start", "end"] * 3


def test_sigterm_reaches_the_running_jobs_and_nothing_new_starts(tmp_path):
  # The job notes the SIGTERM it gets (a trainer saves there); the second job never starts.
  script = ("import signal, sys, time\n"
            "def on_term(*_):\n"
            "  open(sys.argv[1], 'w').write('got SIGTERM'); sys.exit(0)\n"
            "signal.signal(signal.SIGTERM, on_term)\n"
            "open(sys.argv[1] + '.ready', 'w').close()\n"
            "time.sleep(30)\n")
  marker = str(tmp_path / "marker")
  commands = {"first": [sys.executable, "-c", script, marker],
              "second": [sys.executable, "-c", "open(%r, 'w').close()" % str(tmp_path / "second")]}

  def terminate_when_ready():
    while not os.path.exists(marker + ".ready"):
      threading.Event().wait(0.05)
    os.kill(os.getpid(), signal.SIGTERM)

  before = signal.getsignal(signal.SIGTERM)
  threading.Thread(target=terminate_when_ready, daemon=True).start()
  with pytest.raises(jobs.Stopped, match="SIGTERM"):
    jobs.run_parallel(commands, 1, lambda name: str(tmp_path / f"{name}.log"), echo=lambda _: None)
  assert open(marker).read() == "got SIGTERM"
  assert not os.path.exists(tmp_path / "second")
  assert signal.getsignal(signal.SIGTERM) is before  # the caller's handler is back


def test_children_get_the_command_line_without_the_parents_own_flags():
  argv = ["--workdir", "w", "--only", "gla", "--parallel=2", "--tokens", "3", "--parallel", "4"]
  assert jobs.without_flags(argv, ("--only", "--parallel")) == ["--workdir", "w", "--tokens", "3"]
