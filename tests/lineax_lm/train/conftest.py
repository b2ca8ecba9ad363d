"""The one finished tiny training run that the resume, corrupt-checkpoint, rollback, missing-step
and profile tests start from, instead of each training its own."""
import os
import shutil

import pytest

from lineax_lm.train.trainer import train_and_evaluate
from tests.lineax_lm.train.test_trainer import tiny_config


@pytest.fixture(scope="session")
def clean_run(tmp_path_factory):
  """(config, workdir, summary) of one finished 6-step run with checkpoints at steps 2, 4 and 6
  (keep_checkpoints=0: all), profiled at steps 2..3. `config` is the run's config without the
  profiler (which changes no number): runs that continue from a copy use it."""
  config = tiny_config(steps=6)
  config.train.update(dict(checkpoint_every=2, keep_checkpoints=0))
  profiled = config.copy_and_resolve_references()
  profiled.train.update(dict(profile_steps=2, profile_start=1))
  workdir = str(tmp_path_factory.mktemp("clean") / "run")
  summary = train_and_evaluate(profiled, workdir)
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["2", "4", "6"]
  return config, workdir, summary


@pytest.fixture
def clean_copy(clean_run, tmp_path):
  """(config, workdir): a private copy of the clean run's workdir, to damage, resume or roll back."""
  config, workdir, _ = clean_run
  shutil.copytree(workdir, tmp_path / "run")
  return config.copy_and_resolve_references(), str(tmp_path / "run")
