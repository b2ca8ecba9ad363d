"""Study cells sharing one GPU: N processes each stepping a cell, with and without CUDA MPS.

    source launch/h200_env.sh && start_mps /tmp/mps_bench &&
      python benchmarks/concurrent_cells.py --cell gated_deltanet:3:1 --procs 1,4 --mps; stop_mps

The hybrid grid runs `--parallel N` cells as N processes on one GPU (launch/hybrid_study_h200.sh).
Without MPS the GPU time-slices between their contexts, so one process's kernels never overlap
another's; under MPS (`nvidia-cuda-mps-control -d`) they share the GPU as one context and can. For
each process count this starts that many copies of the grid's jitted step (lineax_lm.train.trainer
.Trainer, a `small` cell on random tokens), lets each compile and take three steps, waits until all
are ready, then times `--steps` steps in every process at once; it prints each count's step time
and the cells' combined steps a second over one process alone. MPS runs are clients of the daemon
that CUDA_MPS_PIPE_DIRECTORY names (the launch scripts' own, `start_mps` of launch/h200_env.sh);
the plain runs leave that variable out, so they do not reach it. Details go to --json.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time


def worker(size: str, cell_flag: str, ready_dir: str, procs: int, steps: int) -> dict:
  """One process: compile, step three times, mark ready, wait for the others, time `steps` steps."""
  import jax
  from population_step import cell_setup   # this folder's: a cell's config, mesh and batches
  from lineax_lm.train.trainer import Trainer
  _, config, mesh, model_cfg, batch = cell_setup(size, cell_flag)
  B, L = config.data.global_batch_size, config.data.seq_len
  with jax.set_mesh(mesh):
    trainer = Trainer(config, model_cfg, mesh)
    state = trainer.init()
    batch = trainer.put_batch(batch())
    for _ in range(4):
      state, metrics = trainer.train_step(state, batch)
    jax.block_until_ready(metrics)
    open(os.path.join(ready_dir, str(os.getpid())), "w").close()
    deadline = time.time() + 300
    while len(os.listdir(ready_dir)) < procs and time.time() < deadline:
      time.sleep(0.05)
    start = time.perf_counter()
    for i in range(steps):
      state, metrics = trainer.train_step(state, batch)
      if i % 10 == 9:       # as a training loop reads its metrics: the queue never runs far ahead
        jax.block_until_ready(metrics)
    jax.block_until_ready(metrics)
  return dict(step_ms=1e3 * (time.perf_counter() - start) / steps, tokens_per_step=B * L)


def run_count(a, procs: int, env: dict) -> list[dict]:
  """`procs` workers at once; their rows."""
  with tempfile.TemporaryDirectory(prefix="ready_") as ready:
    cmd = [sys.executable, __file__, "--worker", "--size", a.size, "--cell", a.cell, "--ready", ready,
           "--procs_in_run", str(procs), "--steps", str(a.steps)]
    running = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True) for _ in range(procs)]
    rows = []
    for p in running:
      out, _ = p.communicate()
      if p.returncode != 0:
        raise RuntimeError(f"a worker of {procs} exited with {p.returncode}")
      rows.append(json.loads(out.strip().splitlines()[-1]))
  return rows


MPS_VARIABLES = ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY")


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--size", default="small", help="a size of lineax_lm.experiments.sizes")
  p.add_argument("--cell", default="gated_deltanet:3:1", help="a cell as the grid's --only names it")
  p.add_argument("--procs", default="1,4", help="process counts, each run with all at once")
  p.add_argument("--steps", type=int, default=150, help="timed steps in each process")
  p.add_argument("--mps", action="store_true", help="also run every count above 1 under CUDA MPS")
  p.add_argument("--json", default="", help="write the rows here")
  p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
  p.add_argument("--ready", default="", help=argparse.SUPPRESS)
  p.add_argument("--procs_in_run", type=int, default=1, help=argparse.SUPPRESS)
  a = p.parse_args(argv)
  if a.worker:
    print(json.dumps(worker(a.size, a.cell, a.ready, a.procs_in_run, a.steps)), flush=True)
    return 0
  counts = [int(n) for n in a.procs.split(",")]
  if a.mps and not os.environ.get("CUDA_MPS_PIPE_DIRECTORY"):
    p.error("--mps: CUDA_MPS_PIPE_DIRECTORY names no MPS daemon; start one first "
            "(`source launch/h200_env.sh && start_mps DIR`, as this module's docstring shows)")
  plain_env = {k: v for k, v in os.environ.items() if k not in MPS_VARIABLES}
  runs = [(n, False) for n in counts] + [(n, True) for n in counts if a.mps and n > 1]
  print(f"{a.size} {a.cell}, {a.steps} timed steps a process")
  print("| processes | MPS | step ms (each) | steps/s together, over one alone |")
  print("|---|---|---|---|", flush=True)
  rows, alone = [], None
  for n, mps in runs:
    got = run_count(a, n, dict(os.environ) if mps else plain_env)
    ms = [r["step_ms"] for r in got]
    together = sum(1e3 / m for m in ms)
    alone = alone or (together if n == 1 and not mps else None)
    rows.append(dict(processes=n, mps=mps, step_ms=ms, steps_per_s=together))
    ratio = f"{together / alone:.2f}x" if alone else "-"
    print(f"| {n} | {'yes' if mps else 'no'} | {', '.join(f'{m:.1f}' for m in ms)} | "
          f"{together:.1f} ({ratio}) |", flush=True)
    if a.json:
      with open(a.json, "w") as f:
        json.dump(dict(size=a.size, cell=a.cell, steps=a.steps, rows=rows), f, indent=1)
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
