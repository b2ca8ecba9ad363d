"""The training loop: `train_and_evaluate(config, workdir)`.

One jitted train step over a (data, fsdp, context, tensor) mesh, with parameters sharded by their
logical axes, the batch's rows split over (data, fsdp) and its time axis over context. Mixed
precision: float32 master weights, activations in `model.dtype` (bf16 on accelerators). Gradient
accumulation sums exact token-weighted gradients over micro-batches, so accumulating equals one big
batch. A non-finite loss or gradient leaves the state unchanged, and the loop stops with a
checkpoint of that last good state. SIGTERM / SIGINT save and exit cleanly; restarting with the same
workdir resumes bit-for-bit (state, RNG and data iterator) from the newest checkpoint that passes
its checksums (damaged ones are set aside, see checkpoint). A rollback (`train.restore_step` before
the latest step) sets the later steps aside and trains through them again. A run holds its workdir's
lock (lineax_lm.train.lock) throughout: a second trainer there refuses, naming the first.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import math
import os
import signal
import time
from typing import Any, Callable

import grain
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from lineax_lm import sharding, storage
from lineax_lm.data.pipeline import data_vocab_size, make_dataset
from lineax_lm.models.config import ModelConfig
from lineax_lm.models.hybrid import abstract_model, init_params
from lineax_lm.models.presets import model_config
from lineax_lm.train import checkpoint, losses, metrics as metrics_lib, optim
from lineax_lm.train import distributed, lock, validation

log = logging.getLogger("lineax_lm")
F32 = jnp.float32


class TrainingStopped(RuntimeError):
  """Raised when training stops on a non-finite loss (after saving the last good state)."""


class Interrupted(RuntimeError):
  """A run that SIGTERM / SIGINT stopped after saving its step (`train_and_evaluate`'s summary has
  `stopped_by`). `train_and_evaluate` returns such a run; commands that train several in a row
  (the demo, a sweep, the distillation stages) raise this through `raise_if_interrupted`, so a
  signal ends the command, not just the run it arrived in. Rerunning the command resumes."""

  def __init__(self, summary: dict, workdir: str):
    self.signal = signal.Signals[summary["stopped_by"]]
    super().__init__(f"stopped by {self.signal.name} at step {summary.get('step')} (saved in "
                     f"{workdir}); rerun the same command to resume")


def raise_if_interrupted(summary: dict, workdir: str) -> dict:
  if summary.get("stopped_by"):
    raise Interrupted(summary, workdir)
  return summary


# ------------------------------------------------------------------------------ config checks
def validate_config(config, mesh) -> ModelConfig:
  """Fails before anything compiles, naming the config field that is wrong."""
  validation.check_config(config)  # the range of every numeric field, and relations between fields
  try:
    model_cfg = model_config(config.model)
    model_cfg.linear_mixer_config()  # unknown mixer / mixer option
  except ValueError as e:
    raise ValueError(f"config.model: {e}") from None
  ratio = str(model_cfg.attn_ratio)
  if model_cfg.attn_layers is None and ratio.endswith(":1") and int(ratio.split(":")[0]) > model_cfg.num_layers:
    raise ValueError(f"config.model.attn_ratio={ratio!r} needs at least {ratio.split(':')[0]} linear "
                     f"layers per attention layer, but config.model.num_layers={model_cfg.num_layers}; "
                     "use a smaller ratio or list the layers in config.model.attn_layers")
  vocab = data_vocab_size(config.data)
  if model_cfg.vocab_size < vocab:
    raise ValueError(f"config.model.vocab_size={model_cfg.vocab_size} is smaller than the data's "
                     f"vocabulary ({vocab} ids from config.data)")
  batch, accum = config.data.global_batch_size, config.train.grad_accum
  shards = math.prod(mesh.shape[a] for a in sharding.BATCH_AXES)
  for what, n in (("config.train.grad_accum", accum), ("the number of processes", jax.process_count())):
    if batch % n:
      raise ValueError(f"config.data.global_batch_size={batch} is not divisible by {what} ({n})")
  if (batch // accum) % shards:
    raise ValueError(f"config.data.global_batch_size / config.train.grad_accum = {batch // accum} is not "
                     f"divisible by the mesh's batch axes data*fsdp ({shards})")
  context = mesh.shape.get(sharding.CONTEXT_AXIS, 1)
  if config.data.seq_len % context:
    raise ValueError(f"config.data.seq_len={config.data.seq_len} is not divisible by the mesh's "
                     f"context axis ({context}): each device holds seq_len / context tokens of a row")
  if not sharding.context_within_processes(mesh):
    raise ValueError(f"config.mesh.context={context} spans devices of several processes; each "
                     "process loads whole rows, so keep context * tensor within one host's devices")
  return model_cfg


# ------------------------------------------------------------------------------ objectives
@dataclasses.dataclass
class Objective:
  """What the loop optimises when it is not next-token cross-entropy on `config.data` (used by
  lineax_lm.distill's stages). Every field is optional; the default Objective() is plain training.

  loss: (model, batch, extra) -> (loss_sum, (correct_sum, count)): token sums, as `Trainer._sums`.
  extra: a pytree of arrays every loss call receives (a frozen teacher's parameters), placed by the
    caller; it is an argument of the jitted steps, never part of the saved state.
  init_params: () -> the nnx.Param state to start from instead of a random init (a fresh run only).
  trainable: (path: tuple of str / int) -> bool; other parameters are frozen (no update, no decay).
  dataset: replaces `make_dataset` (same signature), e.g. chat data with assistant-only loss masks.
  """
  loss: Callable | None = None
  extra: Any = None
  init_params: Callable | None = None
  trainable: Callable | None = None
  dataset: Callable | None = None


def _freeze(tx, params, trainable):
  """`tx` with zero gradients and zero updates (weight decay included) on the parameters
  `trainable(path)` rejects. Their Adam moments stay allocated (at zero): that keeps the optimizer
  state one tree, which the sharding and checkpoint code maps leaf by leaf."""
  def frozen(path, _):
    names = tuple(getattr(k, "key", getattr(k, "idx", None)) for k in path if not (
        isinstance(k, jax.tree_util.GetAttrKey) and k.name == "value"))
    return not trainable(names)
  zero = optax.masked(optax.set_to_zero(), jax.tree_util.tree_map_with_path(frozen, params))
  return optax.chain(zero, tx, zero)


# ------------------------------------------------------------------------------ state and steps
@dataclasses.dataclass
class Trainer:
  """Everything jitted for one config on one mesh."""
  config: object
  model_cfg: ModelConfig
  mesh: jax.sharding.Mesh
  objective: Objective = dataclasses.field(default_factory=Objective)

  def __post_init__(self):
    self.tx = optim.make_optimizer(self.config.train)
    self.schedule = optim.learning_rate_schedule(self.config.train)
    self.graphdef, abstract_params, rest = nnx.split(abstract_model(self.model_cfg), nnx.Param, ...)
    if jax.tree_util.tree_leaves(rest):
      raise NotImplementedError("the train step assumes a model whose only state is nnx.Param")
    if self.objective.trainable is not None:
      self.tx = _freeze(self.tx, abstract_params, self.objective.trainable)
    self.abstract_params = abstract_params
    self.num_params = sum(math.prod(x.shape) for x in jax.tree_util.tree_leaves(abstract_params))
    param_sh = sharding.state_shardings(abstract_params, self.mesh)
    abstract_opt = jax.eval_shape(self.tx.init, abstract_params)
    opt_sh = optax.tree_map_params(self.tx, lambda _, s: s, abstract_opt, param_sh,
                                   transform_non_params=lambda _: sharding.replicated(self.mesh))
    rep = sharding.replicated(self.mesh)
    self.state_sharding = dict(step=rep, params=param_sh, opt_state=opt_sh, rng=rep)
    self.batch_sharding = sharding.batch_sharding(self.mesh)
    self._jit_init = jax.jit(self._init, out_shardings=self.state_sharding)
    self.train_step = functools.partial(jax.jit(self._train_step, donate_argnums=0, out_shardings=(
        self.state_sharding, rep)), extra=self.objective.extra)
    self.eval_step = functools.partial(jax.jit(self._eval_step, out_shardings=rep),
                                       extra=self.objective.extra)

  def abstract_state(self):
    return jax.tree_util.tree_map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
        jax.eval_shape(self._init, np.uint32(0), self.abstract_params), self.state_sharding)

  def init(self, params=None):
    """The step-0 state: `params` (default: a random init, one block at a time, see
    models.hybrid.init_params), fresh optimizer state and the run's RNG key."""
    if params is None:
      params = init_params(self.model_cfg, self.config.seed, self.state_sharding["params"])
    return self._jit_init(np.uint32(self.config.seed), params)

  def _init(self, seed, params):
    return dict(step=jnp.zeros((), jnp.int32), params=params, opt_state=self.tx.init(params),
                rng=jax.random.key_data(jax.random.key(seed)))

  def _sums(self, params, batch, extra=None):
    """Token-summed loss, correct-token count and loss-token count of one (micro-)batch."""
    model = nnx.merge(self.graphdef, params)
    if self.objective.loss is not None:
      return self.objective.loss(model, batch, extra)
    mask = batch["loss_mask"].astype(F32)
    inputs = (batch["inputs"], batch.get("segment_ids"), batch.get("positions"))
    chunk = self.config.train.get("loss_chunk", 0)
    if chunk > 0:  # the head fused into the loss, chunk by chunk: no [B, L, vocab] logits
      x, head = model.hidden(*inputs)
      loss_sum, correct = losses.chunked_cross_entropy(x, head, batch["targets"], mask, chunk)
      return loss_sum, (correct, jnp.sum(mask))
    logits = model(*inputs)
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, batch["targets"])
    correct = (jnp.argmax(logits, -1) == batch["targets"]).astype(F32)
    return jnp.sum(ce * mask), (jnp.sum(correct * mask), jnp.sum(mask))

  def _grads(self, params, batch, extra=None):
    accum = self.config.train.grad_accum
    grad_fn = jax.value_and_grad(self._sums, has_aux=True)
    if accum == 1:
      (loss_sum, (correct, count)), grads = grad_fn(params, batch, extra)
      return grads, loss_sum, correct, count
    micro = jax.tree_util.tree_map(lambda x: x.reshape(accum, x.shape[0] // accum, *x.shape[1:]), batch)

    def body(carry, mb):
      (l, (c, n)), g = grad_fn(params, mb, extra)
      return jax.tree_util.tree_map(jnp.add, carry, (g, l, c, n)), None
    zeros = (jax.tree_util.tree_map(jnp.zeros_like, params), *(jnp.zeros((), F32),) * 3)
    (grads, loss_sum, correct, count), _ = jax.lax.scan(body, zeros, micro)
    return grads, loss_sum, correct, count

  def _train_step(self, state, batch, extra=None):
    grads, loss_sum, correct, count = self._grads(state["params"], batch, extra)
    n = jnp.maximum(count, 1.0)
    grads = jax.tree_util.tree_map(lambda g: g / n, grads)
    loss, grad_norm = loss_sum / n, optax.global_norm(grads)
    updates, opt_state = self.tx.update(grads, state["opt_state"], state["params"])
    new = dict(step=state["step"] + 1, params=optax.apply_updates(state["params"], updates),
               opt_state=opt_state, rng=state["rng"])
    ok = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    new = jax.tree_util.tree_map(lambda a, b: jnp.where(ok, a, b), new, state)
    return new, dict(loss=loss, grad_norm=grad_norm, accuracy=correct / n, lr=self.schedule(state["step"]),
                     ok=ok)

  def _eval_step(self, params, batch, extra=None):
    loss_sum, (correct, count) = self._sums(params, batch, extra)
    return dict(loss_sum=loss_sum, correct=correct, count=count)

  def put_batch(self, batch: dict):
    """Process-local numpy batch -> global arrays sharded over the batch axes."""
    return {k: jax.make_array_from_process_local_data(self.batch_sharding, np.asarray(v))
            for k, v in batch.items()}

  def evaluate(self, params, batches) -> dict:
    sums = [self.eval_step(params, self.put_batch(b)) for b in batches]
    tot = {k: float(sum(s[k] for s in sums)) for k in ("loss_sum", "correct", "count")}
    n = max(tot["count"], 1.0)
    return dict(eval_loss=tot["loss_sum"] / n, eval_accuracy=tot["correct"] / n)


# ------------------------------------------------------------------------------ the loop
class _StopSignal:
  """SIGTERM / SIGINT set a flag; the loop saves at the next step boundary and exits."""

  def __init__(self):
    self.requested = None
    self._previous = {}

  def __enter__(self):
    for sig in (signal.SIGTERM, signal.SIGINT):
      try:
        self._previous[sig] = signal.signal(sig, self._handle)
      except ValueError:  # not the main thread
        pass
    return self

  def _handle(self, signum, frame):
    if self.requested is not None and signum == signal.SIGINT:
      raise KeyboardInterrupt  # a second Ctrl-C stops at once
    self.requested = signal.Signals(signum).name

  def __exit__(self, *exc):
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)


def eval_batches(config, dataset=make_dataset):
  """The held-out batches of `config.eval` (a different seed from training), fixed for the run."""
  if not config.eval.steps:
    return []
  it = dataset(config.data, seed=config.eval.seed, process_index=jax.process_index(),
                    process_count=jax.process_count())
  return [next(it) for _ in range(config.eval.steps)]


def _finish_profile(state, step: int, steps: int, started: float, workdir: str):
  """Stops the trace begun `steps` steps ago (at perf_counter `started`) and logs its summary."""
  jax.block_until_ready(state)
  seconds = time.perf_counter() - started
  jax.profiler.stop_trace()
  folder = os.path.join(workdir, "profile")
  md = (f"steps {step - steps + 1}..{step}: host wall {1e3 * seconds / steps:.1f} ms per step\n"
        + metrics_lib.profile_summary(folder, steps))
  with open(os.path.join(folder, "summary.md"), "w") as f:
    f.write(md + "\n")
  log.info("profile (%s):\n%s", folder, md)


def _stop_non_finite(mngr, step: int, state, data_iter, config, m: dict, workdir: str):
  """Raises TrainingStopped for a non-finite step `step + 1`, after logging the diagnosis (first,
  so that a failing save cannot hide it) and making sure the unchanged `state` is on disk: a step
  saved just before (periodically, or the restored one) already holds it. Only a step that passes
  its checksums is named the last good state: one restored unverified may be what went wrong."""
  diagnosis = (f"non-finite loss or gradient at step {step + 1} (loss={float(m['loss'])}, "
               f"grad_norm={float(m['grad_norm'])})")
  log.error("%s; training stops", diagnosis)
  if step in mngr.all_steps():
    mngr.seal()  # a step this run saved is verified once sealed; one it restored unverified is not
    if checkpoint.verify(mngr, step) is None:
      where = f"step {step}, checkpointed before this step, holds the last good state"
    else:
      newest = next((s for s in sorted(mngr.all_steps(), reverse=True)
                     if checkpoint.verify(mngr, s) is None), None)
      where = (f"step {step}, the state before this step, was restored without "
               f"{checkpoint.CHECKSUMS} and may itself be damaged; "
               + (f"the newest verified step is {newest} (--config.train.restore_step={newest})"
                  if newest is not None else "no step is verified"))
  else:
    try:
      checkpoint.save(mngr, step, state, data_iter, config)
      mngr.seal()
    except Exception as e:
      raise TrainingStopped(f"{diagnosis}; saving the last good state as step {step} failed "
                            f"({type(e).__name__}: {e})") from e
    where = f"the last good state is saved as step {step}"
  raise TrainingStopped(f"{diagnosis}; {where} in {workdir}/checkpoints")


def use_compilation_cache(folder: str) -> None:
  """Points XLA's persistent compilation cache at `folder` (`~` expanded), unless it is "" or jax
  already has a cache folder (JAX_COMPILATION_CACHE_DIR or the caller's setting wins). jax decides
  once a process whether the cache is on, at its first compilation: reset_cache lets a process that
  has compiled without one (a notebook) start using it."""
  if not folder or jax.config.jax_compilation_cache_dir:
    return
  from jax.experimental.compilation_cache import compilation_cache
  jax.config.update("jax_compilation_cache_dir", os.path.expanduser(folder))
  compilation_cache.reset_cache()


def train_and_evaluate(config, workdir: str, objective: Objective | None = None) -> dict:
  """Trains `config` in `workdir` (resuming from its latest checkpoint) and returns final metrics.
  `objective`: another loss / start / frozen set / dataset (see Objective); None: plain training."""
  use_compilation_cache(config.train.get("compilation_cache", ""))
  mesh = sharding.make_mesh(config.mesh)
  model_cfg = validate_config(config, mesh)
  storage.as_path(workdir).mkdir(parents=True, exist_ok=True)  # local or gs://
  with lock.WorkdirLock(workdir):  # one trainer per workdir
    return _train(config, workdir, objective, mesh, model_cfg)


def _train(config, workdir: str, objective: Objective | None, mesh, model_cfg: ModelConfig) -> dict:
  t = config.train
  objective = objective or Objective()
  dataset = objective.dataset or make_dataset
  # outside set_mesh: eval_shape would read logical names as mesh axes
  trainer = Trainer(config, model_cfg, mesh, objective)
  with jax.set_mesh(mesh):
    # The next batch is packed in a background thread while the device runs the current step (the
    # loop waits for each step's `ok`); grain keeps each batch's iterator state, so a checkpoint
    # records the position of the batches consumed, not of those fetched ahead.
    data_iter = grain.experimental.ThreadPrefetchDatasetIterator(
        dataset(config.data, seed=config.seed, process_index=jax.process_index(),
                process_count=jax.process_count()), 1)
    mngr = checkpoint.manager(workdir, keep=t.keep_checkpoints, async_save=t.async_checkpointing)
    if mngr.latest_step() is not None:
      state, step = checkpoint.restore(mngr, trainer.abstract_state(), data_iter,
                                       step=t.restore_step if t.restore_step >= 0 else None,
                                       config=config, set_aside_damaged=True)
      log.info("resumed from step %d in %s", step, workdir)
      if step < t.steps and max(mngr.all_steps()) > step:  # a rollback: it saves those steps again
        moved = checkpoint.set_aside_after(mngr, step, f"rolled-back-to-{step}")
        log.warning("restored step %d, before the latest checkpoint: this run trains through the "
                    "later steps again, so their checkpoints were moved aside (not deleted): %s",
                    step, ", ".join(moved))
    else:
      checkpoint.check_fresh_start(mngr, t.restore_step)
      state = trainer.init(None if objective.init_params is None else objective.init_params())
    step = int(state["step"])
    log.info("model: %s, %.1fM parameters, mesh %s", model_cfg.mixer, trainer.num_params / 1e6,
             dict(mesh.shape))
    evals = eval_batches(config, dataset)
    writer = metrics_lib.MetricsWriter(workdir, t.steps, start_step=step)
    peak = metrics_lib.peak_flops_per_device()
    tokens_per_step = config.data.global_batch_size * config.data.seq_len
    summary, window_start, window_steps = {}, time.perf_counter(), 0
    try:
      with _StopSignal() as stop:
        while step < t.steps:
          if t.profile_steps and step == t.profile_start:
            jax.profiler.start_trace(os.path.join(workdir, "profile"))
            profile_start = time.perf_counter()
          new_state, m = trainer.train_step(state, trainer.put_batch(next(data_iter)))
          if not bool(m["ok"]):
            state = new_state  # unchanged by the step: the last good state
            _stop_non_finite(mngr, step, state, data_iter, config, m, workdir)
          state, step, window_steps = new_state, step + 1, window_steps + 1
          writer.advance()
          if t.profile_steps and step == t.profile_start + t.profile_steps:
            _finish_profile(state, step, t.profile_steps, profile_start, workdir)
          if step % t.log_every == 0 or step == t.steps:
            jax.block_until_ready(m)
            elapsed = time.perf_counter() - window_start
            summary = {k: float(v) for k, v in m.items() if k != "ok"}
            summary["tokens_per_s"] = window_steps * tokens_per_step / elapsed
            if peak:
              summary["mfu"] = 6 * trainer.num_params * summary["tokens_per_s"] / (peak * jax.device_count())
            summary["memory_gib"] = metrics_lib.device_memory_gib()
            writer.write(step, summary)
            window_start, window_steps = time.perf_counter(), 0
          if evals and (step % config.eval.every == 0 or step == t.steps):
            summary.update(trainer.evaluate(state["params"], evals))
            writer.write(step, {k: v for k, v in summary.items() if k.startswith("eval_")})
          requested = distributed.agree_on_stop(stop.requested)  # every host stops at one step
          if step % t.checkpoint_every == 0 or step == t.steps or requested:
            checkpoint.save(mngr, step, state, data_iter, config)
          if requested:
            log.warning("%s received: saved step %d in %s; rerun the same command to resume",
                        requested, step, workdir)
            summary["stopped_by"] = requested
            break
      if evals and "eval_accuracy" not in summary:  # a finished run restarted: report it anyway
        summary.update(trainer.evaluate(state["params"], evals))
    finally:
      mngr.seal()
      mngr.close()
      data_iter.close()
      writer.close()
  summary["step"] = step
  summary["num_params"] = trainer.num_params
  return summary
