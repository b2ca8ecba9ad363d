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

`train_population(configs, workdirs)` trains runs that differ only in their seed as one program
(a seed axis vmapped over the state and the batches), each member's workdir exactly a lone run's.
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import json
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
  """Everything jitted for one config on one mesh.

  `seeds` non-empty: a population, one run of `config` per seed trained side by side in one
  program. Its state and batches gain a leading member axis and the steps are `jax.vmap`s of the
  lone ones: a small model's kernels, too narrow to fill an accelerator, run that many times wider
  at about the same launch count. `abstract_state`, `member` and `stack` move between a member's
  (lone) state, which is what each member's checkpoints hold, and the population's."""
  config: object
  model_cfg: ModelConfig
  mesh: jax.sharding.Mesh
  objective: Objective = dataclasses.field(default_factory=Objective)
  seeds: tuple[int, ...] = ()

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
    self.member_sharding = dict(step=rep, params=param_sh, opt_state=opt_sh, rng=rep)
    self.population = len(self.seeds)
    if self.population and self.objective.init_params is not None:
      raise ValueError("a population (`seeds`) starts from random inits: Objective.init_params "
                       "names one start for every member")
    stacked = _stacked if self.population else (lambda sh: sh)
    self.state_sharding = jax.tree_util.tree_map(stacked, self.member_sharding)
    self.batch_sharding = stacked(sharding.batch_sharding(self.mesh))
    self._jit_init, step, eval_step = _shared_programs(self)
    self.train_step = functools.partial(step, extra=self.objective.extra)
    self.eval_step = functools.partial(eval_step, extra=self.objective.extra)

  def _programs(self):
    """The jitted init, train step and eval step of this Trainer's own methods."""
    step, eval_step = self._train_step, self._eval_step
    if self.population:
      step, eval_step = self._population_step, self._population_eval_step
    rep = sharding.replicated(self.mesh)
    return (jax.jit(self._init, out_shardings=self.member_sharding),
            jax.jit(step, donate_argnums=0, out_shardings=(self.state_sharding, rep)),
            jax.jit(eval_step, out_shardings=rep))

  def abstract_state(self):
    """A lone run's (a member's) state, as its checkpoints hold it."""
    return jax.tree_util.tree_map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
        jax.eval_shape(self._init, np.uint32(0), self.abstract_params), self.member_sharding)

  def init(self, params=None):
    """The step-0 state: `params` (default: a random init, one block at a time, see
    models.hybrid.init_params), fresh optimizer state and the run's RNG key; a population's
    members each from their own seed."""
    if self.population:
      return self.stack([self._init_member(seed) for seed in self.seeds])
    return self._init_member(self.config.seed, params)

  def _init_member(self, seed: int, params=None):
    if params is None:
      params = init_params(self.model_cfg, seed, self.member_sharding["params"])
    return self._jit_init(np.uint32(seed), params)

  def member(self, tree, i: int):
    """Member `i`'s state (or step metrics) out of a population's; a lone run's as it is."""
    return jax.tree_util.tree_map(lambda x: x[i], tree) if self.population else tree

  def stack(self, members: list):
    """A population's state from its members' (in `seeds` order)."""
    return jax.tree_util.tree_map(lambda sh, *x: jax.device_put(jnp.stack(x), sh),
                                  self.state_sharding, *members)

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

  def _population_step(self, state, batch, extra=None):
    """Every member's `_train_step` at once. A non-finite step of any member leaves every member
    unchanged (`ok` is the population's), so the members stay at one step, as the loop and the
    checkpoints count them; `member_ok` says which failed."""
    new, m = jax.vmap(self._train_step, in_axes=(0, 0, None))(state, batch, extra)
    ok = jnp.all(m["ok"])
    new = jax.tree_util.tree_map(lambda a, b: jnp.where(ok, a, b), new, state)
    return new, dict(m, ok=ok, member_ok=m["ok"])

  def _population_eval_step(self, params, batch, extra=None):
    """Every member's `_eval_step` on the same batch."""
    return jax.vmap(self._eval_step, in_axes=(0, None, None))(params, batch, extra)

  def _eval_step(self, params, batch, extra=None):
    loss_sum, (correct, count) = self._sums(params, batch, extra)
    return dict(loss_sum=loss_sum, correct=correct, count=count)

  def put_batch(self, batch: dict, member: bool = False):
    """Process-local numpy batch -> global arrays sharded over the batch axes: a population's
    batch holds each member's stacked, [members, B, T], unless `member` (one batch, as every
    member evaluates on)."""
    sh = sharding.batch_sharding(self.mesh) if member else self.batch_sharding
    return {k: jax.make_array_from_process_local_data(sh, np.asarray(v)) for k, v in batch.items()}

  def batch_sums(self, params, batches) -> list[dict]:
    """Per batch, the held-out token sums {"loss_sum", "correct", "count"} (host arrays; a
    population's over its members): what `evaluate` adds up, kept apart for a bootstrap over
    batches."""
    return [jax.device_get(self.eval_step(params, self.put_batch(b, member=True))) for b in batches]

  def evaluate(self, params, batches):
    """Held-out loss and accuracy: a dict, or a population's list of one dict per member (every
    member on the same batches)."""
    sums = self.batch_sums(params, batches)
    def one(i=None):
      tot = {k: float(sum(np.asarray(s[k]) if i is None else np.asarray(s[k])[i] for s in sums))
             for k in ("loss_sum", "correct", "count")}
      n = max(tot["count"], 1.0)
      return dict(eval_loss=tot["loss_sum"] / n, eval_accuracy=tot["correct"] / n)
    return [one(i) for i in range(self.population)] if self.population else one()


# The jitted programs of the last few plain-training Trainers, by what determines them: the train
# config (optimizer, schedule, loss options; not the fields only the loop reads), the model, the
# mesh and the population size. A second Trainer of one config in one process (a run resumed in
# the same process, a notebook's or a test's repeated runs, a population member's lone rerun)
# reuses the first one's jitted functions, whose traces and executables jax keeps, instead of
# tracing, lowering and compiling them again. Their closures hold the first Trainer, whose
# optimizer, schedule and graphdef equal its own. An Objective's loss or trainable are closures a
# key cannot compare: those Trainers jit their own.
_PROGRAMS: collections.OrderedDict = collections.OrderedDict()
_PROGRAMS_KEPT = 4
_LOOP_ONLY = frozenset({"async_checkpointing", "checkpoint_every", "compilation_cache",
                        "keep_checkpoints", "log_every", "profile_start", "profile_steps",
                        "restore_step"})


def _shared_programs(trainer: Trainer):
  o = trainer.objective
  if o.loss is not None or o.trainable is not None or o.extra is not None:
    return trainer._programs()
  train = {k: v for k, v in trainer.config.train.to_dict().items() if k not in _LOOP_ONLY}
  key = (json.dumps(train, sort_keys=True, default=repr), trainer.model_cfg, trainer.mesh,
         trainer.population)
  if key not in _PROGRAMS:
    _PROGRAMS[key] = trainer._programs()
    while len(_PROGRAMS) > _PROGRAMS_KEPT:
      _PROGRAMS.popitem(last=False)
  _PROGRAMS.move_to_end(key)
  return _PROGRAMS[key]


def _stacked(sh):
  """A member's sharding with a leading (unsharded) member axis."""
  return jax.sharding.NamedSharding(sh.mesh, jax.sharding.PartitionSpec(None, *sh.spec))


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
  so that a failing save cannot hide it) and making sure the unchanged `state` is on disk."""
  diagnosis = (f"non-finite loss or gradient at step {step + 1} (loss={float(m['loss'])}, "
               f"grad_norm={float(m['grad_norm'])})")
  log.error("%s; training stops", diagnosis)
  where = _keep_last_good(mngr, step, state, data_iter, config, diagnosis)
  raise TrainingStopped(f"{diagnosis}; {where} in {workdir}/checkpoints")


def _keep_last_good(mngr, step: int, state, data_iter, config, diagnosis: str) -> str:
  """Makes sure `state`, the last good state, is on disk as `step` and says where it is: a step
  saved just before (periodically, or the restored one) already holds it. Only a step that passes
  its checksums is named the last good state: one restored unverified may be what went wrong."""
  if step in mngr.all_steps():
    mngr.seal()  # a step this run saved is verified once sealed; one it restored unverified is not
    if checkpoint.verify(mngr, step) is None:
      return f"step {step}, checkpointed before this step, holds the last good state"
    newest = next((s for s in sorted(mngr.all_steps(), reverse=True)
                   if checkpoint.verify(mngr, s) is None), None)
    return (f"step {step}, the state before this step, was restored without "
            f"{checkpoint.CHECKSUMS} and may itself be damaged; "
            + (f"the newest verified step is {newest} (--config.train.restore_step={newest})"
               if newest is not None else "no step is verified"))
  try:
    checkpoint.save(mngr, step, state, data_iter, config)
    mngr.seal()
  except Exception as e:
    raise TrainingStopped(f"{diagnosis}; saving the last good state as step {step} failed "
                          f"({type(e).__name__}: {e})") from e
  return f"the last good state is saved as step {step}"


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
  return _train_runs([config], [workdir], objective)[0]


def train_population(configs: list, workdirs: list[str], objective: Objective | None = None) -> list[dict]:
  """Trains configs that differ only in `seed` side by side in one program (Trainer's `seeds`),
  each in its own workdir exactly as `train_and_evaluate` would: its checkpoints, data position and
  metrics are a lone run's, so either can resume the other's run. Returns each run's metrics.
  A population resumes from the newest step every member has saved (`train.restore_step` names
  another); a non-finite step of one member stops them all."""
  if len(configs) != len(workdirs) or not configs:
    raise ValueError(f"train_population: {len(configs)} configs for {len(workdirs)} workdirs")
  config = configs[0]
  for c, w in zip(configs[1:], workdirs[1:]):
    if _without_seed(c) != _without_seed(config):
      raise ValueError(f"train_population: the config of {w} differs from that of {workdirs[0]} in "
                       "more than its seed; a population shares everything else")
  if len(set(workdirs)) != len(workdirs) or len({c.seed for c in configs}) != len(configs):
    raise ValueError(f"train_population: every member needs its own workdir and seed; got "
                     f"{workdirs} with seeds {[c.seed for c in configs]}")
  return _train_runs(configs, workdirs, objective)


def _train_runs(configs: list, workdirs: list[str], objective: Objective | None) -> list[dict]:
  config = configs[0]
  use_compilation_cache(config.train.get("compilation_cache", ""))
  mesh = sharding.make_mesh(config.mesh)
  model_cfg = validate_config(config, mesh)
  with contextlib.ExitStack() as locks:
    for w in workdirs:
      storage.as_path(w).mkdir(parents=True, exist_ok=True)  # local or gs://
      locks.enter_context(lock.WorkdirLock(w))  # one trainer per workdir
    return _train(configs, workdirs, objective, mesh, model_cfg)


def _without_seed(config) -> dict:
  tree = config.to_dict()
  tree.pop("seed", None)
  return tree


def _restore(trainer, mngrs, data_iters, configs, workdirs) -> tuple[Any, int]:
  """The state to start from and its step: each member's newest intact checkpoint (a population:
  the newest step all members hold), or a fresh init where no member has one. Later steps of a
  rollback are set aside (not deleted), since this run trains through them again."""
  t = configs[0].train
  if all(m.latest_step() is None for m in mngrs):
    for m in mngrs:
      checkpoint.check_fresh_start(m, t.restore_step)
    init = trainer.objective.init_params
    return trainer.init(None if init is None else init()), 0
  want = t.restore_step if t.restore_step >= 0 else None
  if trainer.population and want is None:
    common = set.intersection(*(set(m.all_steps()) for m in mngrs))
    if not common:
      raise checkpoint.CheckpointError(
          "the population's workdirs hold no checkpoint step in common ("
          + "; ".join(f"{w}: {sorted(m.all_steps())}" for w, m in zip(workdirs, mngrs))
          + "): resume them one by one (train_and_evaluate), or start the population afresh")
    want = max(common)
  members, steps = [], []
  for m, it, c, w in zip(mngrs, data_iters, configs, workdirs):
    state, step = checkpoint.restore(m, trainer.abstract_state(), it, step=want, config=c,
                                     set_aside_damaged=True)
    log.info("resumed from step %d in %s", step, w)
    if step < t.steps and max(m.all_steps()) > step:
      moved = checkpoint.set_aside_after(m, step, f"rolled-back-to-{step}")
      log.warning("restored step %d, before the latest checkpoint: this run trains through the "
                  "later steps again, so their checkpoints were moved aside (not deleted): %s",
                  step, ", ".join(moved))
    members.append(state)
    steps.append(step)
  if not trainer.population:
    return members[0], steps[0]
  return trainer.stack(members), steps[0]


def _train(configs, workdirs, objective: Objective | None, mesh, model_cfg: ModelConfig) -> list[dict]:
  config, t = configs[0], configs[0].train
  objective = objective or Objective()
  dataset = objective.dataset or make_dataset
  seeds = tuple(c.seed for c in configs) if len(configs) > 1 else ()
  # outside set_mesh: eval_shape would read logical names as mesh axes
  trainer = Trainer(config, model_cfg, mesh, objective, seeds)
  members = range(len(configs))
  with jax.set_mesh(mesh):
    # The next batch is packed in a background thread while the device runs the current step (the
    # loop waits for each step's `ok`); grain keeps each batch's iterator state, so a checkpoint
    # records the position of the batches consumed, not of those fetched ahead.
    data_iters = [grain.experimental.ThreadPrefetchDatasetIterator(
        dataset(c.data, seed=c.seed, process_index=jax.process_index(),
                process_count=jax.process_count()), 1) for c in configs]
    mngrs = [checkpoint.manager(w, keep=t.keep_checkpoints, async_save=t.async_checkpointing)
             for w in workdirs]
    writers = []
    try:
      state, step = _restore(trainer, mngrs, data_iters, configs, workdirs)
      log.info("model: %s, %.1fM parameters, mesh %s%s", model_cfg.mixer, trainer.num_params / 1e6,
               dict(mesh.shape), f", seeds {list(seeds)} as one population" if seeds else "")
      evals = eval_batches(config, dataset)
      writers = [metrics_lib.MetricsWriter(w, t.steps, start_step=step) for w in workdirs]
      peak = metrics_lib.peak_flops_per_device()
      tokens_per_step = config.data.global_batch_size * config.data.seq_len
      summaries, window_start, window_steps = [{} for _ in members], time.perf_counter(), 0

      def save(step):
        for i in members:
          checkpoint.save(mngrs[i], step, trainer.member(state, i), data_iters[i], configs[i])

      def evaluate():
        scores = trainer.evaluate(state["params"], evals)
        for i in members:
          summaries[i].update(scores[i] if seeds else scores)

      with _StopSignal() as stop:
        while step < t.steps:
          if t.profile_steps and step == t.profile_start:
            jax.profiler.start_trace(os.path.join(workdirs[0], "profile"))
            profile_start = time.perf_counter()
          batches = [next(it) for it in data_iters]
          batch = batches[0] if not seeds else {k: np.stack([b[k] for b in batches]) for k in batches[0]}
          new_state, m = trainer.train_step(state, trainer.put_batch(batch))
          if not bool(m["ok"]):
            state = new_state  # unchanged by the step: the last good state
            if not seeds:
              _stop_non_finite(mngrs[0], step, state, data_iters[0], config, m, workdirs[0])
            _stop_population(trainer, mngrs, step, state, data_iters, configs, m, workdirs)
          state, step, window_steps = new_state, step + 1, window_steps + 1
          for w in writers:
            w.advance()
          if t.profile_steps and step == t.profile_start + t.profile_steps:
            _finish_profile(state, step, t.profile_steps, profile_start, workdirs[0])
          if step % t.log_every == 0 or step == t.steps:
            jax.block_until_ready(m)
            elapsed = time.perf_counter() - window_start
            per_member = {k: v for k, v in m.items() if k not in ("ok", "member_ok")}
            for i in members:
              summary = {k: float(v) for k, v in trainer.member(per_member, i).items()}
              summary["tokens_per_s"] = window_steps * tokens_per_step / elapsed
              if peak:
                summary["mfu"] = (6 * trainer.num_params * summary["tokens_per_s"]
                                  / (peak * jax.device_count()))
              summary["memory_gib"] = metrics_lib.device_memory_gib()
              summaries[i] = summary
              writers[i].write(step, summary)
            window_start, window_steps = time.perf_counter(), 0
          if evals and (step % config.eval.every == 0 or step == t.steps):
            evaluate()
            for i in members:
              writers[i].write(step, {k: v for k, v in summaries[i].items() if k.startswith("eval_")})
          requested = distributed.agree_on_stop(stop.requested)  # every host stops at one step
          if step % t.checkpoint_every == 0 or step == t.steps or requested:
            save(step)
          if requested:
            log.warning("%s received: saved step %d in %s; rerun the same command to resume",
                        requested, step, ", ".join(workdirs))
            for s in summaries:
              s["stopped_by"] = requested
            break
      if evals and "eval_accuracy" not in summaries[0]:  # a finished run restarted: report it anyway
        evaluate()
    finally:
      for mngr in mngrs:
        mngr.seal()
        mngr.close()
      for it in data_iters:
        it.close()
      for w in writers:
        w.close()
  for s in summaries:
    s["step"] = step
    s["num_params"] = trainer.num_params
  return summaries


def _stop_population(trainer, mngrs, step: int, state, data_iters, configs, m: dict, workdirs):
  """`_stop_non_finite` for a population: every member's unchanged state kept, the members whose
  step was non-finite named."""
  bad = [f"seed {c.seed} (loss={float(loss)}, grad_norm={float(norm)})"
         for c, ok, loss, norm in zip(configs, np.asarray(m["member_ok"]), np.asarray(m["loss"]),
                                      np.asarray(m["grad_norm"])) if not ok]
  diagnosis = f"non-finite loss or gradient at step {step + 1} in {', '.join(bad)}"
  log.error("%s; the population stops", diagnosis)
  where = [f"{w}/checkpoints: " + _keep_last_good(mngr, step, trainer.member(state, i), it, c, diagnosis)
           for i, (mngr, it, c, w) in enumerate(zip(mngrs, data_iters, configs, workdirs))]
  raise TrainingStopped(f"{diagnosis}; " + "; ".join(where))
