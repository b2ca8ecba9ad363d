"""The training stack on CPU: sharding (8 fake devices), exact resume, checkpoint errors, bad
configs."""
import json
import os
import shutil
import signal
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh

from lineax_lm import sharding
from lineax_lm.train import checkpoint
from lineax_lm.train.config import base_config
from lineax_lm.train.trainer import Trainer, TrainingStopped, train_and_evaluate, validate_config
from lineax_lm.data.pipeline import make_dataset
from tests.lineax_lm.tiny import TINY_MIXER


def tiny_config(steps=6, mixer="gated_deltanet", **model):
  # The mixer at tests/lineax_lm/tiny.py's widths (Gated DeltaNet: 2 heads of 16): fla's defaults
  # (6 heads of 256 keys and 512 values at any hidden size) make each step's program ~100x the
  # work, and nothing these tests check depends on the mixer's width.
  c = base_config()
  c.model.update({**dict(vocab_size=64, num_layers=2, hidden=32, heads=2, mixer=mixer, attn_ratio="1:1",
                         backend="xla", mixer_cfg=TINY_MIXER.get(mixer, {})), **model})
  c.data.update(dict(seq_len=32, global_batch_size=8))
  c.data.mqar.update(dict(vocab_size=64, num_kv_pairs=4))
  c.train.update(dict(steps=steps, log_every=1, checkpoint_every=3, warmup_steps=2, lr=3e-3,
                      async_checkpointing=False))
  c.eval.update(dict(every=1000, steps=1))
  return c


def params_of(workdir, config):
  mesh = sharding.make_mesh(config.mesh)
  trainer = Trainer(config, validate_config(config, mesh), mesh)
  mngr = checkpoint.manager(workdir)
  it = make_dataset(config.data, seed=config.seed, process_index=0, process_count=1)
  state, step = checkpoint.restore(mngr, trainer.abstract_state(), it)
  mngr.close()
  return state, step, next(it)


@pytest.mark.slow
@pytest.mark.multi_device
def test_sharded_step_equals_single_device_step():
  config = tiny_config(attn_ratio="pure")
  config.model.update(dict(hidden=64, heads=4))
  model_cfg = validate_config(config, sharding.make_mesh(config.mesh))
  batch = next(make_dataset(config.data, seed=0, process_index=0, process_count=1))
  results = []
  for devices, shape in ((jax.devices()[:1], (1, 1, 1, 1)), (jax.devices(), (2, 2, 1, 2))):
    mesh = Mesh(np.array(devices).reshape(shape), sharding.MESH_AXES,
                axis_types=(jax.sharding.AxisType.Auto,) * len(sharding.MESH_AXES))
    trainer = Trainer(config, model_cfg, mesh)
    with jax.set_mesh(mesh):
      state = trainer.init()
      state, metrics = trainer.train_step(state, trainer.put_batch(batch))
    results.append((jax.device_get(state["params"]), jax.device_get(metrics)))
  (p1, m1), (p8, m8) = results
  for name in ("loss", "grad_norm", "accuracy"):
    np.testing.assert_allclose(m1[name], m8[name], rtol=1e-5)
  # Adam normalises each update to ~lr, so reduction-order noise in near-zero gradients moves a
  # parameter by a fraction of lr: compare against lr.
  for a, b in zip(jax.tree_util.tree_leaves(p1), jax.tree_util.tree_leaves(p8)):
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-3 * config.train.lr)


def _sigterm_when_step(workdir, step):
  """Sends SIGTERM to this process once metrics.jsonl reports `step` (the loop then saves and exits)."""
  def watch():
    path = os.path.join(workdir, "metrics.jsonl")
    while True:
      if os.path.exists(path):
        with open(path) as f:
          if any(json.loads(line).get("step", 0) >= step for line in f if line.strip()):
            os.kill(os.getpid(), signal.SIGTERM)
            return
      time.sleep(0.02)
  threading.Thread(target=watch, daemon=True).start()


@pytest.mark.slow
def test_interrupted_and_resumed_run_is_bit_identical(clean_run, tmp_path):
  """A run stopped by SIGTERM and rerun ends where the straight clean run (conftest.py) ends."""
  config, straight, _ = clean_run
  resumed = str(tmp_path / "resumed")
  _sigterm_when_step(resumed, 3)
  summary = train_and_evaluate(config, resumed)
  assert summary.get("stopped_by") == "SIGTERM" and summary["step"] < 6
  train_and_evaluate(config, resumed)  # the same command again resumes and finishes
  s1, step1, next1 = params_of(straight, config)
  s2, step2, next2 = params_of(resumed, config)
  assert step1 == step2 == 6
  for a, b in zip(jax.tree_util.tree_leaves(s1), jax.tree_util.tree_leaves(s2)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  for k in next1:  # the data iterators stand at the same place
    np.testing.assert_array_equal(next1[k], next2[k])


@pytest.mark.slow
def test_corrupt_checkpoint_is_set_aside_and_the_run_resumes_from_an_intact_one(clean_copy, caplog):
  config, workdir = clean_copy  # the clean run (conftest.py): checkpoints at steps 2, 4, 6
  ckpts = os.path.join(workdir, "checkpoints")
  for root, _, files in os.walk(os.path.join(ckpts, "6", "state")):
    for name in files:  # tear every file of the latest state
      with open(os.path.join(root, name), "wb") as f:
        f.write(b"torn")
  with caplog.at_level("WARNING", logger="lineax_lm"):
    assert train_and_evaluate(config, workdir)["step"] == 6  # from step 4, by itself
  assert "checkpoint step 6" in caplog.text and "resuming from step 4" in caplog.text
  assert sorted(os.listdir(ckpts)) == ["2", "4", "6"]
  set_aside = os.path.join(workdir, checkpoint.SET_ASIDE)
  assert os.listdir(set_aside) == ["6-damaged"]  # the torn step is kept, not deleted
  config.train.restore_step = 2  # a rollback to the earlier checkpoint trains through step 4 again
  config.train.steps = 4
  assert train_and_evaluate(config, workdir)["step"] == 4
  assert sorted(os.listdir(set_aside)) == ["4-rolled-back-to-2", "6-damaged", "6-rolled-back-to-2"]


@pytest.mark.slow
def test_missing_checkpoint_step_is_a_clear_error(clean_copy):
  config, workdir = clean_copy
  config.train.restore_step = 3
  with pytest.raises(checkpoint.CheckpointError, match="no checkpoint for step 3"):
    train_and_evaluate(config, workdir)


@pytest.mark.slow
def test_nan_loss_stops_with_last_good_checkpoint(tmp_path):
  config = tiny_config(steps=6)
  config.train.lr = 1e30  # the first update blows the parameters up
  config.train.warmup_steps = 1
  config.train.clip_norm = 0.0
  workdir = str(tmp_path / "run")
  with pytest.raises(TrainingStopped, match="non-finite loss or gradient at step"):
    train_and_evaluate(config, workdir)
  mngr = checkpoint.manager(workdir)
  assert mngr.latest_step() is not None
  mngr.close()


@pytest.mark.parametrize("field,value,message", [
    ("model.mixer", "gated_deltanett", "unknown mixer"),
    ("model.attn_ratio", "30:1", "needs at least 30 linear layers"),
    ("model.attn_ratio", "3-1", "attn_ratio"),
    pytest.param("data.global_batch_size", 12, "not divisible by the mesh's batch axes",
                 marks=pytest.mark.multi_device),
    ("model.vocab_size", 16, "smaller than the data's vocabulary"),
])
def test_bad_config_fails_before_compiling(field, value, message):
  config = tiny_config()
  section, key = field.split(".")
  config[section][key] = value
  with pytest.raises(ValueError, match=message):
    validate_config(config, sharding.make_mesh(config.mesh))


def test_config_typo_on_the_command_line_suggests_the_field():
  from lineax_lm.train import __main__ as cli
  with pytest.raises(SystemExit, match="did you mean --config.train.steps"):
    cli.parse_flags(["train", "--config", "configs/base.py", "--config.train.stpes=5", "--workdir", "/tmp/x"])


@pytest.mark.parametrize("argv, says", [
    (["--config", "configs/quickstart.py:gdn"], "^error: flag --workdir=None: --workdir is required"),
    (["--config", "configs/quickstart.py:nope", "--workdir", "/tmp/x"],
     r"^error: flag --config=configs/quickstart.py:nope: ValueError: quickstart variant must be one of"),
    (["--config", "configs/distill.py:nope", "--workdir", "/tmp/x"], "is not a student; choose from")])
def test_bad_command_line_is_one_line(argv, says):
  from lineax_lm.train import __main__ as cli
  cli.FLAGS.unparse_flags()  # a fresh process's flags: no --workdir left from an earlier parse
  with pytest.raises(SystemExit, match=says) as e:
    cli.parse_flags(["train", *argv])
  assert "\n" not in str(e.value)


@pytest.mark.slow
def test_profile_steps_write_a_summary(clean_run):
  _, workdir, _ = clean_run  # profiled at steps 2..3 (conftest.py)
  with open(os.path.join(workdir, "profile", "summary.md")) as f:
    summary = f.read()
  assert summary.startswith("steps 2..3: host wall") and "no device events" in summary  # CPU


def test_loading_a_run_for_inference_prints_no_library_warnings(clean_run, caplog):
  import lineax_lm
  _, workdir, _ = clean_run
  with caplog.at_level("WARNING"):
    loaded = lineax_lm.load(workdir)
  assert loaded.step == 6
  assert [r.getMessage() for r in caplog.records if r.levelno >= 30] == []


@pytest.mark.parametrize("source", ["mqar", "text"])
def test_prefetched_batches_keep_the_checkpoint_position(source):
  """The trainer's iterator packs batches ahead in a thread; its state is that of the batches
  consumed, so a checkpoint resumes at the next one."""
  import grain
  data = tiny_config().data
  if source == "text":
    data.update(dict(source="text", paths="README.md", tokenizer="byte", packing="concat"))
  straight = make_dataset(data, seed=0, process_index=0, process_count=1)
  want = [next(straight) for _ in range(3)]
  ahead = grain.experimental.ThreadPrefetchDatasetIterator(
      make_dataset(data, seed=0, process_index=0, process_count=1), 1)
  got = [next(ahead)]
  time.sleep(0.2)                       # the thread has fetched batch 1 (and waits to put 2)
  state = ahead.get_state()             # what a checkpoint after step 1 records
  got += [next(ahead), next(ahead)]
  ahead.close()
  resumed = make_dataset(data, seed=0, process_index=0, process_count=1)
  resumed.set_state(state)
  for a, b in zip(want, got):
    for k in a:
      np.testing.assert_array_equal(a[k], b[k])
  again = next(resumed)                 # a run resumed from that checkpoint reads batch 1 next
  for k in want[1]:
    np.testing.assert_array_equal(again[k], want[1][k])


@pytest.fixture
def jax_cache_settings():
  """jax's cache settings are process-wide: put them back as they were after the test."""
  from jax.experimental.compilation_cache import compilation_cache
  before = (jax.config.jax_compilation_cache_dir, jax.config.jax_persistent_cache_min_compile_time_secs)
  yield
  jax.config.update("jax_compilation_cache_dir", before[0])
  jax.config.update("jax_persistent_cache_min_compile_time_secs", before[1])
  compilation_cache.reset_cache()


def test_the_compilation_cache_is_used_after_compiling_without_one(tmp_path, jax_cache_settings):
  """train_and_evaluate calls use_compilation_cache(config.train.compilation_cache) first; a
  process that compiled before (a notebook) starts writing to and reading from the folder."""
  from lineax_lm.train.trainer import use_compilation_cache
  jax.config.update("jax_compilation_cache_dir", None)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
  jax.jit(lambda x: x + 1)(1.0)  # jax decides whether a cache is on at a first compilation
  use_compilation_cache(str(tmp_path / "cache"))
  hits = []
  jax.monitoring.register_event_listener(
      lambda event, **kw: hits.append(event) if event == "/jax/compilation_cache/cache_hits" else None)
  step = lambda x: jnp.tanh(x @ x.T).sum()
  jax.jit(step).lower(jnp.ones((8, 8))).compile()
  assert os.listdir(tmp_path / "cache") and not hits
  jax.clear_caches()  # in-memory caches: the next compile is a relaunch's
  jax.jit(step).lower(jnp.ones((8, 8))).compile()
  assert hits
  use_compilation_cache(str(tmp_path / "other"))  # a folder jax already has is kept
  assert jax.config.jax_compilation_cache_dir == str(tmp_path / "cache")


def test_trainers_of_one_program_share_their_jitted_steps():
  """A second Trainer of one train config, model and mesh reuses the first one's jitted steps (no
  retrace or recompile); a field the step reads (lr) or an Objective's loss gets its own."""
  from lineax_lm.train.trainer import Objective
  config = tiny_config()
  mesh = sharding.make_mesh(config.mesh)
  model_cfg = validate_config(config, mesh)
  first = Trainer(config, model_cfg, mesh)
  loop_only = config.copy_and_resolve_references()
  loop_only.train.update(dict(log_every=5, checkpoint_every=7, restore_step=2))
  lr = config.copy_and_resolve_references()
  lr.train.lr = 1e-2
  assert Trainer(loop_only, model_cfg, mesh).train_step.func is first.train_step.func
  assert Trainer(lr, model_cfg, mesh).train_step.func is not first.train_step.func
  own = Trainer(config, model_cfg, mesh, Objective(loss=lambda model, batch, extra: None))
  assert own.train_step.func is not first.train_step.func
