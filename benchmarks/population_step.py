"""A study cell's train step alone against its seeds as one population (`Trainer(seeds=...)`).

    python benchmarks/population_step.py --size small --cells gated_deltanet:3:1,transformer --seeds 3

A `small` cell (24 layers of width 256) runs at 1-3% MFU on an H200: its kernels are too narrow to
fill the GPU. `grid --population` trains a cell's seeds as one program with a seed axis; this times
what that buys: the step of one seed, then of `--seeds` seeds vmapped, both the grid's jitted step
(lineax_lm.train.trainer.Trainer) on random tokens, and prints the population's tokens/s over the
lone step's (S seeds in one step against S lone steps in a row). The first step of each (its
compile) is timed apart. Details go to --json.
"""
from __future__ import annotations

import argparse
import json
import time

import jax
import numpy as np


def time_step(trainer, batch, steps: int) -> tuple[float, float]:
  """(seconds of the first step, median seconds of `steps` more), the state donated step to step."""
  state = trainer.init()
  batch = trainer.put_batch(batch)
  start = time.perf_counter()
  state, m = trainer.train_step(state, batch)
  jax.block_until_ready(m)
  first = time.perf_counter() - start
  times = []
  for _ in range(steps):
    start = time.perf_counter()
    state, m = trainer.train_step(state, batch)
    jax.block_until_ready(m)
    times.append(time.perf_counter() - start)
  return first, float(np.median(times))


def cell_setup(size: str, cell_flag: str):
  """(cell name, training config, mesh, model config, batch) of a grid cell at seed 0, where
  batch(*lead) draws random-token rows [*lead, B, L] (`lead`: a population's seed axis)."""
  from lineax_lm import sharding
  from lineax_lm.experiments import cells
  from lineax_lm.train.trainer import validate_config
  (cell,) = cells.build_cells(size, cell_flag + "@0", corpus="")
  config = cell["config"]
  mesh = sharding.make_mesh(config.mesh)
  model_cfg = validate_config(config, mesh)
  B, L = config.data.global_batch_size, config.data.seq_len
  rng = np.random.default_rng(0)
  tokens = lambda *shape: rng.integers(0, model_cfg.vocab_size, shape, dtype=np.int32)
  batch = lambda *lead: dict(inputs=tokens(*lead, B, L), targets=tokens(*lead, B, L),
                             loss_mask=np.ones((*lead, B, L), np.int32))
  return cell["name"], config, mesh, model_cfg, batch


def measure(size: str, cell_flag: str, seeds: int, steps: int) -> dict:
  from lineax_lm.train.trainer import Trainer
  name, config, mesh, model_cfg, batch = cell_setup(size, cell_flag)
  B, L = config.data.global_batch_size, config.data.seq_len
  with jax.set_mesh(mesh):
    lone_first, lone = time_step(Trainer(config, model_cfg, mesh), batch(), steps)
    pop_first, pop = time_step(Trainer(config, model_cfg, mesh, seeds=tuple(range(seeds))),
                               batch(seeds), steps)
  return dict(size=size, cell=name, seeds=seeds, tokens_per_step=B * L,
              lone_step_ms=1e3 * lone, lone_first_s=lone_first,
              population_step_ms=1e3 * pop, population_first_s=pop_first,
              speedup=seeds * lone / pop)


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--size", default="small", help="a size of lineax_lm.experiments.sizes")
  p.add_argument("--cells", default="gated_deltanet:3:1,transformer",
                 help="cells as the grid's --only names them, one seed each (mixer:ratio or transformer)")
  p.add_argument("--seeds", type=int, default=3, help="the population's size")
  p.add_argument("--steps", type=int, default=20, help="timed steps after the first")
  p.add_argument("--json", default="", help="write the rows here")
  a = p.parse_args(argv)
  if a.seeds < 2:
    p.error(f"--seeds: a population has at least 2 seeds; got {a.seeds}")
  print(f"device: {jax.devices()[0].device_kind}, jax {jax.__version__}; size {a.size}, "
        f"{a.seeds} seeds, {a.steps} timed steps")
  print("| cell | lone step ms (first s) | population step ms (first s) | population / lone steps in a row |")
  print("|---|---|---|---|", flush=True)
  rows = []
  for c in filter(None, a.cells.split(",")):  # each row as it is measured: a time limit keeps the rest
    r = measure(a.size, c, a.seeds, a.steps)
    rows.append(r)
    print(f"| {r['cell']} | {r['lone_step_ms']:.1f} ({r['lone_first_s']:.0f}) | "
          f"{r['population_step_ms']:.1f} ({r['population_first_s']:.0f}) | {r['speedup']:.2f}x |", flush=True)
    if a.json:
      with open(a.json, "w") as f:
        json.dump(dict(device=str(jax.devices()[0].device_kind), jax=jax.__version__, rows=rows), f, indent=1)
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
