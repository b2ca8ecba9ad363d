"""Seeds trained as one population (`train_population`): each member is its lone run."""
import os

import jax
import numpy as np
import pytest

from lineax_lm.train.metrics import read_rows
from lineax_lm.train.trainer import TrainingStopped, train_and_evaluate, train_population
from tests.lineax_lm.train.test_trainer import _sigterm_when_step, params_of, tiny_config


def seeded(config, seed, **train):
  c = config.copy_and_resolve_references()
  c.seed = seed
  c.train.update(train)
  return c


def assert_same_run(a: str, b: str, config):
  """Two workdirs hold the same run to float tolerance: the logged losses, the final state and the
  data iterator's position. (Not bitwise: vmapped the dots and reductions run in other shapes.)"""
  losses = [[(r["step"], r["loss"]) for r in read_rows(os.path.join(w, "metrics.jsonl")) if "loss" in r]
            for w in (a, b)]
  assert [s for s, _ in losses[0]] == [s for s, _ in losses[1]]
  np.testing.assert_allclose([x for _, x in losses[0]], [x for _, x in losses[1]], rtol=1e-5)
  (s1, step1, next1), (s2, step2, next2) = params_of(a, config), params_of(b, config)
  assert step1 == step2
  for x, y in zip(jax.tree_util.tree_leaves(s1), jax.tree_util.tree_leaves(s2)):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-4, atol=1e-6)
  for k in next1:
    np.testing.assert_array_equal(next1[k], next2[k])


@pytest.mark.slow
def test_a_population_trains_each_seed_as_its_lone_run_and_either_resumes(clean_run, tmp_path):
  """Seeds 0 and 1 as one population, stopped by SIGTERM and run again, end where their lone runs
  end (seed 0's: the clean run of conftest.py); a lone run then resumes a member's workdir as its
  own."""
  config, lone0, _ = clean_run  # 6 steps, checkpoints at 2, 4, 6
  members = [str(tmp_path / f"seed{s}") for s in (0, 1)]
  configs = [seeded(config, s) for s in (0, 1)]
  _sigterm_when_step(members[1], 3)
  stopped = train_population(configs, members)
  assert all(m.get("stopped_by") == "SIGTERM" and m["step"] < 6 for m in stopped)
  done = train_population(configs, members)  # the same command again resumes and finishes
  assert [m["step"] for m in done] == [6, 6] and all("eval_loss" in m for m in done)
  assert "6" in os.listdir(os.path.join(members[1], "checkpoints"))
  assert_same_run(members[0], lone0, config)
  lone1 = str(tmp_path / "lone1")
  train_and_evaluate(seeded(config, 1), lone1)
  assert_same_run(members[1], lone1, seeded(config, 1))
  # the lone trainer takes a member's workdir over where the population stopped
  train_and_evaluate(seeded(config, 1, steps=8), members[1])
  train_and_evaluate(seeded(config, 1, steps=8), lone1)
  assert_same_run(members[1], lone1, seeded(config, 1))


def test_a_population_shares_everything_but_the_seed(tmp_path):
  config = tiny_config(steps=2)
  other = seeded(config, 1)
  other.train.lr = 1e-3
  with pytest.raises(ValueError, match="differs from that of .*seed0 in more than its seed"):
    train_population([config, other], [str(tmp_path / "seed0"), str(tmp_path / "seed1")])
  with pytest.raises(ValueError, match="its own workdir and seed"):
    train_population([config, config], [str(tmp_path / "a"), str(tmp_path / "b")])


@pytest.mark.slow
def test_a_non_finite_member_stops_the_population_naming_it(tmp_path):
  config = tiny_config(steps=6)
  config.train.update(dict(lr=1e30, warmup_steps=1, clip_norm=0.0))  # the first update blows up
  members = [str(tmp_path / f"seed{s}") for s in (0, 1)]
  with pytest.raises(TrainingStopped, match=r"non-finite loss or gradient at step \d+ in seed 0"):
    train_population([seeded(config, s) for s in (0, 1)], members)
  for w in members:  # every member's last good state is on disk
    assert os.listdir(os.path.join(w, "checkpoints"))


def test_a_population_step_lowers_for_cuda_with_the_gpu_kernels():
  """vmap over the seeds puts a member axis on the Pallas GPU kernels' grids (pallas_call's
  batching rule): the population step of a GDN hybrid lowers for CUDA with the same kernels as a
  lone step (pallas_kernels.gpu_aot: no GPU needed)."""
  import jax.numpy as jnp
  from lineax_lm import sharding
  from lineax_lm.models.presets import model_config
  from lineax_lm.train.trainer import Trainer
  from pallas_kernels import gpu_aot
  config = tiny_config(steps=2, backend="gpu")
  mesh = sharding.make_mesh(config.mesh)
  names = []
  for seeds, step in ((), "_train_step"), ((0, 1), "_population_step"):
    trainer = Trainer(config, model_config(config.model), mesh, seeds=seeds)
    lead = (len(seeds),) if seeds else ()
    batch = {k: jax.ShapeDtypeStruct((*lead, 8, 32), jnp.int32)
             for k in ("inputs", "targets", "loss_mask")}
    with jax.set_mesh(mesh):
      kernels = gpu_aot.triton_kernels(getattr(trainer, step), jax.eval_shape(trainer.init), batch)
    names.append(sorted(k.name for k in kernels))
  assert names[0] == names[1] and "_state_kernel" in names[0]
