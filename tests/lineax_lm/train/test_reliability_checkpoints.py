"""Checkpoints that recover by themselves and metrics that stay exact (issue 22): damaged steps are
found by their checksums, set aside (never deleted) and skipped; rollbacks train through the steps
they overwrite; keep_checkpoints=0 keeps everything; metrics.jsonl keeps one row per step."""
import json
import logging
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lineax_lm import sharding
from lineax_lm.train import checkpoint, metrics as metrics_lib
from lineax_lm.train.trainer import Trainer, TrainingStopped, train_and_evaluate, validate_config
from tests.lineax_lm.train.test_trainer import params_of, tiny_config


# ------------------------------------------------------------------------------ helpers
def _state(step):
  return {"step": jnp.asarray(step, jnp.int32), "w": jnp.arange(64, dtype=jnp.float32) + step}


def _saved(tmp_path, steps=(1, 2, 3), keep=0):
  """A manager of `tmp_path` holding `steps` of a small state (no model: fast)."""
  mngr = checkpoint.manager(str(tmp_path), keep=keep, async_save=False)
  for s in steps:
    checkpoint.save(mngr, s, _state(s))
  return mngr


def _scribble(step_dir, torn=False):
  """Random bytes over the middle of the largest array file of `step_dir`'s state (its size kept),
  or, `torn`, every file of the state cut to 4 bytes (damage Orbax itself notices)."""
  files = [os.path.join(r, n) for r, _, names in os.walk(os.path.join(step_dir, "state")) for n in names]
  if torn:
    for path in files:
      with open(path, "wb") as f:
        f.write(b"torn")
    return
  path = max(files, key=os.path.getsize)
  size = os.path.getsize(path)
  with open(path, "r+b") as f:
    f.seek(size // 4)
    f.write(np.random.default_rng(0).bytes(max(size // 2, 1)))


def _files(directory):
  return sorted(os.path.relpath(os.path.join(r, n), directory)
                for r, _, names in os.walk(directory) for n in names)


def _set_aside(workdir):
  folder = os.path.join(workdir, checkpoint.SET_ASIDE)
  return sorted(os.listdir(folder)) if os.path.isdir(folder) else []


def _loss_rows(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [row["step"] for row in map(json.loads, f) if "loss" in row]


# ------------------------------------------------------------------------------ checkpoint level
def test_every_step_carries_checksums_that_catch_random_bytes(tmp_path):
  mngr = _saved(tmp_path)
  assert all(checkpoint.verify(mngr, s) is None for s in (1, 2, 3))
  _scribble(tmp_path / "checkpoints" / "3")
  assert "does not match its sha256" in checkpoint.verify(mngr, 3)
  assert checkpoint.verify(mngr, 2) is None
  mngr.close()


def test_damaged_newest_step_falls_back_to_the_newest_intact_one(tmp_path, caplog):
  mngr = _saved(tmp_path)
  _scribble(tmp_path / "checkpoints" / "3")
  _scribble(tmp_path / "checkpoints" / "2", torn=True)
  before = _files(tmp_path)
  with caplog.at_level(logging.WARNING, logger="lineax_lm"):
    state, step = checkpoint.restore(mngr, checkpoint.abstract(_state(0)), set_aside_damaged=True)
  assert step == 1 and int(state["step"]) == 1
  np.testing.assert_array_equal(state["w"], np.arange(64) + 1)
  assert "step 3" in caplog.text and "sha256" in caplog.text and "step 2" in caplog.text
  assert sorted(mngr.all_steps()) == [1]
  assert _set_aside(tmp_path) == ["2-damaged", "3-damaged"]
  after = [f.replace(checkpoint.SET_ASIDE + "/2-damaged", "checkpoints/2")
            .replace(checkpoint.SET_ASIDE + "/3-damaged", "checkpoints/3") for f in _files(tmp_path)]
  assert sorted(after) == before  # moved, nothing deleted
  mngr.close()


def test_readers_skip_damaged_steps_without_moving_them(tmp_path):
  mngr = _saved(tmp_path)
  _scribble(tmp_path / "checkpoints" / "3")
  _, step = checkpoint.restore(mngr, checkpoint.abstract(_state(0)))
  assert step == 2 and sorted(mngr.all_steps()) == [1, 2, 3] and not _set_aside(tmp_path)
  mngr.close()


def test_an_explicitly_requested_damaged_step_is_an_error(tmp_path):
  mngr = _saved(tmp_path)
  _scribble(tmp_path / "checkpoints" / "2")
  with pytest.raises(checkpoint.CheckpointError, match=r"step 2 .* is damaged: file .* sha256.*\[1, 3\]"):
    checkpoint.restore(mngr, checkpoint.abstract(_state(0)), step=2, set_aside_damaged=True)
  assert _set_aside(tmp_path) == ["2-damaged"]
  mngr.close()


def test_a_step_without_checksums_restores_unverified_or_is_set_aside(tmp_path, caplog):
  mngr = _saved(tmp_path)
  os.remove(tmp_path / "checkpoints" / "3" / checkpoint.CHECKSUMS)  # a run killed before sealing
  with caplog.at_level(logging.WARNING, logger="lineax_lm"):
    _, step = checkpoint.restore(mngr, checkpoint.abstract(_state(0)), set_aside_damaged=True)
  assert step == 3 and "unverified" in caplog.text
  _scribble(tmp_path / "checkpoints" / "3", torn=True)
  _, step = checkpoint.restore(mngr, checkpoint.abstract(_state(0)), set_aside_damaged=True)
  assert step == 2 and _set_aside(tmp_path) == ["3-damaged"]
  mngr.close()


def _trained(step):
  """A state whose array is incompressible, as trained weights are: bytes garbled inside its file
  still decode (into values of 1e30 and beyond), where a compressible array's fail to."""
  w = np.random.default_rng(step).normal(size=(64, 64)).astype(np.float32)
  return {"step": jnp.asarray(step, jnp.int32), "w": jnp.asarray(w)}


def _garble(step_dir, n=64):
  """`n` random bytes over the middle of the largest file of `step_dir`'s state."""
  files = [os.path.join(r, f) for r, _, names in os.walk(os.path.join(step_dir, "state")) for f in names]
  path = max(files, key=os.path.getsize)
  with open(path, "r+b") as f:
    f.seek(os.path.getsize(path) // 2)
    f.write(np.random.default_rng(0).bytes(n))


def test_a_garbled_step_without_checksums_is_set_aside(tmp_path, caplog):
  mngr = checkpoint.manager(str(tmp_path), keep=0, async_save=False)
  for s in (1, 2, 3):
    checkpoint.save(mngr, s, _trained(s))
  os.remove(tmp_path / "checkpoints" / "3" / checkpoint.CHECKSUMS)  # a run killed before sealing
  _garble(tmp_path / "checkpoints" / "3")
  with caplog.at_level(logging.WARNING, logger="lineax_lm"):
    state, step = checkpoint.restore(mngr, checkpoint.abstract(_trained(0)), set_aside_damaged=True)
  assert step == 2
  np.testing.assert_array_equal(state["w"], _trained(2)["w"])
  assert "restores implausible values (w hold NaN, inf or values beyond 1e19)" in caplog.text
  assert _set_aside(tmp_path) == ["3-damaged"]
  mngr.close()


def test_implausible_values_shapes_dtypes_and_step_counters():
  target = checkpoint.abstract(_trained(0))
  assert checkpoint.implausibility(_trained(3), target, 3) == ""
  for w, why in [(np.full((64, 64), np.inf, np.float32), "w hold NaN, inf or values beyond 1e19"),
                 (np.full((64, 64), 3e19, np.float32), "w hold NaN, inf or values beyond 1e19"),
                 (np.zeros((64, 32), np.float32), "w is float32[64, 32], the target float32[64, 64]"),
                 (np.zeros((64, 64), np.float16), "w is float16[64, 64], the target float32[64, 64]")]:
    assert checkpoint.implausibility({**_trained(3), "w": jnp.asarray(w)}, target, 3) == why
  assert checkpoint.implausibility(_trained(20), target, 3) == "its step counter reads 20"


def test_an_unverified_step_is_never_named_the_last_good_state(tmp_path):
  from lineax_lm.train.trainer import _stop_non_finite
  mngr = _saved(tmp_path, steps=(1, 2))
  os.remove(tmp_path / "checkpoints" / "2" / checkpoint.CHECKSUMS)  # restored unverified
  nan = {"loss": float("nan"), "grad_norm": float("nan")}
  with pytest.raises(TrainingStopped, match=rf"step 2, the state before this step, was restored "
                     rf"without {checkpoint.CHECKSUMS} and may itself be damaged; the newest verified "
                     r"step is 1 \(--config.train.restore_step=1\)"):
    _stop_non_finite(mngr, 2, _state(2), None, None, nan, str(tmp_path))
  mngr.close()


def test_restore_step_without_a_checkpoint_is_an_error(tmp_path):
  config = tiny_config()
  config.train.restore_step = 5
  with pytest.raises(checkpoint.CheckpointError, match=r"config.train.restore_step=5, but .*run/"
                                                       r"checkpoints holds no checkpoint. Move a step"):
    train_and_evaluate(config, str(tmp_path / "run"))


def test_a_fresh_start_names_the_steps_set_aside(tmp_path, caplog):
  mngr = _saved(tmp_path, steps=(1, 2))
  for step in (1, 2):
    checkpoint.set_aside(mngr, step, "damaged")  # what a rerun finds after every step was damaged
  with caplog.at_level(logging.WARNING, logger="lineax_lm"):
    checkpoint.check_fresh_start(mngr, -1)
  assert "training starts from step 0. Steps set aside earlier" in caplog.text
  assert "1-damaged, 2-damaged" in caplog.text
  with pytest.raises(checkpoint.CheckpointError, match=r"holds no checkpoint; .*checkpoints-set-aside "
                                                       r"holds 1-damaged, 2-damaged"):
    checkpoint.check_fresh_start(mngr, 2)
  mngr.close()


def test_saving_an_existing_step_replaces_it_and_keeps_the_old_one_aside(tmp_path):
  mngr = _saved(tmp_path, steps=(1, 2))
  checkpoint.save(mngr, 2, _state(20))  # Orbax alone raises StepAlreadyExistsError here
  state, step = checkpoint.restore(mngr, checkpoint.abstract(_state(0)))
  assert step == 2 and int(state["step"]) == 20 and checkpoint.verify(mngr, 2) is None
  assert _set_aside(tmp_path) == ["2-replaced"]
  mngr.close()


@pytest.mark.parametrize("keep,left", [(0, [1, 2, 3, 4]), (1, [4]), (2, [3, 4])])
def test_keep_checkpoints_zero_keeps_all_and_the_last_always_stays(tmp_path, keep, left):
  mngr = _saved(tmp_path, steps=(1, 2, 3, 4), keep=keep)
  assert sorted(mngr.all_steps()) == left
  mngr.close()
  assert sorted(os.listdir(tmp_path / "checkpoints")) == [str(s) for s in left]


def test_negative_keep_checkpoints_names_the_field(tmp_path):
  with pytest.raises(ValueError, match=r"config.train.keep_checkpoints=-1: must be >= 0"):
    checkpoint.manager(str(tmp_path), keep=-1)


def test_metrics_resumed_at_a_step_drop_the_rows_past_it(tmp_path):
  writer = metrics_lib.MetricsWriter(str(tmp_path), 6, enabled=True)
  for step in range(1, 7):  # a run killed by kill -9 at step 6, its last checkpoint at step 4
    writer.write(step, {"loss": 1.0 / step})
  writer.close()
  with open(tmp_path / "metrics.jsonl", "a") as f:
    f.write('{"step": 7, "lo')  # torn by the kill
  writer = metrics_lib.MetricsWriter(str(tmp_path), 6, start_step=4, enabled=True)
  for step in (5, 6):
    writer.write(step, {"loss": 1.0 / step})
  writer.close()
  assert _loss_rows(tmp_path) == [1, 2, 3, 4, 5, 6]


def test_the_log_line_of_an_eval_row_prints_its_metrics(tmp_path, caplog):
  writer = metrics_lib.MetricsWriter(str(tmp_path), 2, enabled=True)
  with caplog.at_level("INFO", logger="lineax_lm"):
    writer.write(1, {"loss": 2.5, "lr": 1e-3, "param_norm": 9.0})
    writer.write(2, {"eval_loss": 1.25, "eval_accuracy": 0.5})
  writer.close()
  lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("step ")]
  assert lines == ["step 1  loss=2.5  lr=0.001", "step 2  eval_loss=1.25  eval_accuracy=0.5"]


# ------------------------------------------------------------------------------ the trainer
# clean_run / clean_copy (conftest.py): one finished 6-step run, checkpoints at steps 2, 4, 6.
def _same_params(a, b):
  for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.slow
def test_rollback_trains_through_the_later_steps_and_matches_a_clean_run(clean_run, clean_copy, caplog):
  config, workdir = clean_copy
  config.train.restore_step = 2  # the recovery a CheckpointError recommends
  with caplog.at_level(logging.WARNING, logger="lineax_lm"):
    summary = train_and_evaluate(config, workdir)
  assert summary["step"] == 6 and summary["loss"] == clean_run[2]["loss"]
  assert "moved aside (not deleted)" in caplog.text
  assert _set_aside(workdir) == ["4-rolled-back-to-2", "6-rolled-back-to-2"]
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["2", "4", "6"]
  _same_params(params_of(workdir, config)[0], params_of(clean_run[1], config)[0])
  assert _loss_rows(workdir) == [1, 2, 3, 4, 5, 6]


@pytest.mark.slow
def test_damaged_newest_checkpoint_resumes_from_the_previous_intact_one(clean_copy, caplog):
  config, workdir = clean_copy
  _scribble(os.path.join(workdir, "checkpoints", "6"))  # random bytes: Orbax alone restores garbage
  config.train.steps = 8  # a run continued past its damaged last checkpoint
  with caplog.at_level(logging.WARNING, logger="lineax_lm"):
    summary = train_and_evaluate(config, workdir)
  assert summary["step"] == 8
  assert "checkpoint step 6" in caplog.text and "sha256" in caplog.text
  assert "resuming from step 4" in caplog.text
  assert _set_aside(workdir) == ["6-damaged"]  # kept for the user to inspect
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["2", "4", "6", "8"]
  assert _loss_rows(workdir) == list(range(1, 9))  # steps 5 and 6 logged once


@pytest.mark.slow
def test_damaged_older_checkpoint_is_found_on_fallback(clean_run, clean_copy, caplog):
  """The newest step is torn and unsealed (a run killed before its checksums), the one before it has
  random bytes: the run must not resume from the garbage of step 4 but from step 2."""
  config, workdir = clean_copy
  os.remove(os.path.join(workdir, "checkpoints", "6", checkpoint.CHECKSUMS))
  _scribble(os.path.join(workdir, "checkpoints", "6"), torn=True)
  _scribble(os.path.join(workdir, "checkpoints", "4"))
  with caplog.at_level(logging.WARNING, logger="lineax_lm"):
    summary = train_and_evaluate(config, workdir)
  assert summary["step"] == 6 and summary["loss"] == clean_run[2]["loss"]
  assert "resuming from step 2" in caplog.text and "step 4: file" in caplog.text
  assert _set_aside(workdir) == ["4-damaged", "6-damaged"]


@pytest.mark.slow
def test_an_unverified_newest_step_of_garbage_values_is_set_aside_not_resumed(clean_run, clean_copy,
                                                                             caplog, monkeypatch):
  """The newest step lost its checksums (a run killed before sealing) and restores garbage values:
  the run must not resume from it (and stop at NaN a step later), but from step 4. Which bytes of
  a trained state's files decode into garbage, rather than fail to decode, depends on the order
  Orbax wrote its arrays in (test_a_garbled_step_without_checksums_is_set_aside shows it on one
  array), so the restore here hands back the values garbage bytes decode into: 1e30 and beyond."""
  config, workdir = clean_copy
  os.remove(os.path.join(workdir, "checkpoints", "6", checkpoint.CHECKSUMS))
  restore_items = checkpoint._restore_items

  def garbage_at_step_6(mngr, step, *args, **kwargs):
    state = restore_items(mngr, step, *args, **kwargs)
    scale = lambda x: x * 1e30 if jnp.issubdtype(x.dtype, jnp.floating) else x  # noqa: E731
    return jax.tree_util.tree_map(scale, state) if step == 6 else state

  monkeypatch.setattr(checkpoint, "_restore_items", garbage_at_step_6)
  with caplog.at_level(logging.WARNING, logger="lineax_lm"):
    summary = train_and_evaluate(config, workdir)
  assert summary["step"] == 6 and summary["loss"] == clean_run[2]["loss"]
  assert "restores implausible values" in caplog.text and "resuming from step 4" in caplog.text
  assert _set_aside(workdir) == ["6-damaged"]


@pytest.mark.slow
def test_changed_model_says_what_changed(clean_run, monkeypatch):
  config, workdir, _ = clean_run
  # The metadata tells, before any array is read (a doomed restore of a large step reads much).
  monkeypatch.setattr(checkpoint, "_restore_items",
                      lambda *a, **k: pytest.fail("restored the arrays of a changed model"))
  changed = config.copy_and_resolve_references()
  changed.model.hidden = 48
  mesh = sharding.make_mesh(changed.mesh)
  trainer = Trainer(changed, validate_config(changed, mesh), mesh)
  mngr = checkpoint.manager(workdir)
  with pytest.raises(checkpoint.CheckpointError,
                     match=r"model / config changed \(config.model.hidden: 32 in the checkpoint, 48 now;"
                           r" .* has shape \(.*32.*\) in the checkpoint, \(.*48.*\) now"):
    checkpoint.restore(mngr, trainer.abstract_state(), config=changed, set_aside_damaged=True)
  assert sorted(mngr.all_steps()) == [2, 4, 6]  # nothing set aside: the checkpoint is fine
  mngr.close()


@pytest.mark.slow
def test_non_finite_step_right_after_a_save_diagnoses_and_keeps_that_save(tmp_path, caplog):
  config = tiny_config(steps=6)
  config.train.update(dict(lr=1e30, warmup_steps=1, clip_norm=0.0, checkpoint_every=1))
  workdir = str(tmp_path / "run")
  with caplog.at_level(logging.ERROR, logger="lineax_lm"), pytest.raises(
      TrainingStopped, match=r"non-finite loss or gradient at step (\d+) .*; step \d+, checkpointed "
                             r"before this step, holds the last good state"):
    train_and_evaluate(config, workdir)
  assert "non-finite loss or gradient" in caplog.text
  mngr = checkpoint.manager(workdir)
  assert checkpoint.verify(mngr, mngr.latest_step()) is None
  mngr.close()
