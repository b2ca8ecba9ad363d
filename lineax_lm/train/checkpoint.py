"""Orbax checkpoints of everything a bit-for-bit resume needs, verified before they are trusted.

Each step directory holds three items: `state` (model parameters, optimizer state, step and RNG
key data, saved asynchronously), `data` (the grain iterator's state) and `config` (JSON, for humans
and for `eval`/`distill` to rebuild the model). Restoring takes the target shardings from an
abstract state, so a run can resume on a different mesh.

Orbax catches a torn file structure but not flipped bytes inside an array file (those restore as
garbage parameters), so once a save has finished, `Manager.seal` writes `CHECKSUMS` into the step
directory: the sha256 and size of every file in it. `restore` checks them first. A step without
checksums (saved before them, or by a run killed before it sealed) is trusted only after a full
plausibility check of what it restores (`implausibility`: shapes and dtypes as the target's, every
floating-point value finite and far from overflowing, its step counter its own step). A step whose
files do not match, or that has no checksums and does not restore or is implausible, is damaged:
the trainer moves it into `<workdir>/checkpoints-set-aside/` (never deletes it) and falls back to
the newest intact step. The same folder takes the steps after a rollback (`restore_step` earlier
than the latest), which the run is about to train through again, so a save never meets a step that
already exists.
"""
from __future__ import annotations

import json
import logging
import math
import os

import grain
import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp
from etils import epath

from lineax_lm import storage

log = logging.getLogger("lineax_lm")


def _drop_read_only_notices(record: logging.LogRecord) -> bool:
  """Orbax warns on every read-only manager that it is read-only and which options that turns
  off: every `load` and eval would print them, though read-only is what the reader asked for."""
  return not str(record.msg).startswith(("CheckpointManagerOptions.read_only=True",
                                         "Given directory is read only"))


logging.getLogger("absl").addFilter(_drop_read_only_notices)

UNVERIFIED = "unverified"  # verify(): the step has no checksums
CHECKSUMS = "lineax_checksums.json"  # in each step directory, written once the save has finished
SET_ASIDE = "checkpoints-set-aside"  # beside `checkpoints/`: Orbax wants no extra folders inside it


class CheckpointError(RuntimeError):
  pass


class Manager(ocp.CheckpointManager):
  """Orbax's CheckpointManager that remembers the steps it saved until their checksums are written
  (`seal`). Only steps this process saved are sealed: a step left unsealed by a killed run stays
  unverified rather than being vouched for after the fact."""

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self.async_save = kwargs.get("options", ocp.CheckpointManagerOptions()).enable_async_checkpointing
    self.unsealed: list[int] = []

  def seal(self):
    """Waits for the saves in flight, then writes the checksums of the steps saved since the last
    seal (process 0; every process sees the finished files on the shared checkpoint directory)."""
    self.wait_until_finished()
    saved, self.unsealed = self.unsealed, []
    if jax.process_index() != 0:
      return
    for step in saved:
      step_dir = self.directory / str(step)
      if step_dir.exists():  # not already removed by max_to_keep
        _write_json(step_dir / CHECKSUMS, {"algorithm": "sha256", "files": _file_digests(step_dir)})


def checkpoint_dir(workdir) -> epath.Path:
  """`<workdir>/checkpoints` (local or gs://...)."""
  return storage.as_path(workdir) / "checkpoints"


def manager(workdir: str, *, keep: int = 3, best_metric: str | None = None, best_mode: str = "min",
            async_save: bool = True) -> Manager:
  """The checkpoint manager of `<workdir>/checkpoints`.

  keep: how many of the latest steps to keep (`config.train.keep_checkpoints`); 0 keeps every step.
    0 cannot mean "keep none": the final step is what the run exists to produce, and Orbax's
    max_to_keep=0 would delete it along with every other step.
  """
  if keep < 0:
    raise ValueError(f"config.train.keep_checkpoints={keep}: must be >= 0 (the number of latest "
                     "checkpoints to keep; 0 keeps them all)")
  options = ocp.CheckpointManagerOptions(
      max_to_keep=keep or None, create=True, enable_async_checkpointing=async_save,
      best_fn=(lambda m: m[best_metric]) if best_metric else None, best_mode=best_mode,
      keep_checkpoints_without_metrics=True)
  return Manager(
      checkpoint_dir(workdir), options=options,
      item_handlers={"state": ocp.StandardCheckpointHandler(), "data": grain.checkpoint.CheckpointHandler(),
                     "config": ocp.JsonCheckpointHandler()})


def save(mngr: Manager, step: int, state, data_iter=None, config=None, metrics=None) -> bool:
  """Saves `step` (asynchronously when the manager is async; checksums follow at the next save or
  `seal`). A step that already exists is set aside first: Orbax refuses to overwrite one (even with
  force=True), and a run only saves a step twice after going back to an earlier state."""
  items = {"state": ocp.args.StandardSave(state)}
  if data_iter is not None:
    items["data"] = grain.checkpoint.CheckpointSave(data_iter)
  if config is not None:
    items["config"] = ocp.args.JsonSave(config.to_dict() if hasattr(config, "to_dict") else dict(config))
  mngr.seal()
  if step in mngr.all_steps():
    where = set_aside(mngr, step, "replaced")
    log.warning("checkpoint step %d already existed: moved it to %s before saving the new step %d",
                step, where, step)
  saved = mngr.save(step, args=ocp.args.Composite(**items), metrics=metrics, force=True)
  mngr.unsealed.append(step)
  if not mngr.async_save:
    mngr.seal()
  return saved


def set_aside(mngr: Manager, step: int, reason: str) -> str:
  """Moves step directory `step` into `<workdir>/checkpoints-set-aside/<step>-<reason>` (a new name
  if that exists) and returns where it went. Nothing is deleted: the user decides what to drop."""
  mngr.wait_until_finished()
  folder = mngr.directory.parent / SET_ASIDE
  target = folder / f"{step}-{reason}"
  n = 1
  while target.exists():
    n += 1
    target = folder / f"{step}-{reason}-{n}"
  if jax.process_index() == 0:
    folder.mkdir(parents=True, exist_ok=True)
    (mngr.directory / str(step)).rename(target)
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils
    multihost_utils.sync_global_devices(f"lineax_lm set aside checkpoint {step}")
  mngr.reload()
  return str(target)


def set_aside_after(mngr: Manager, step: int, reason: str) -> list[str]:
  """Sets aside every step after `step` (a rollback: the run trains through them again)."""
  return [set_aside(mngr, s, reason) for s in sorted(s for s in mngr.all_steps() if s > step)]


def verify(mngr: Manager, step: int) -> str | None:
  """Checks step `step`'s files against its checksums: None when they match, UNVERIFIED when it
  has none (saved before checksums, or the run was killed before they were written), otherwise
  what is wrong."""
  step_dir = mngr.directory / str(step)
  path = step_dir / CHECKSUMS
  if not path.exists():
    return UNVERIFIED
  try:
    want = json.loads(path.read_text())["files"]
  except (ValueError, KeyError, TypeError) as e:
    return f"its {CHECKSUMS} is unreadable ({type(e).__name__}: {e})"
  got = _file_digests(step_dir)
  for name, (size, digest) in sorted(want.items()):
    if name not in got:
      return f"file {name} is missing"
    if got[name][0] != size:
      return f"file {name} has {got[name][0]} bytes, {size} when saved"
    if got[name][1] != digest:
      return f"file {name} does not match its sha256 (its contents changed since the save)"
  return None


def reader(workdir) -> Manager:
  """A read-only manager of `<workdir>/checkpoints` for inference: `restore(..., params_only=True)`
  reads the parameters of a step and nothing else (no optimizer state, no data iterator)."""
  # Every item a step holds has its handler, or Orbax warns at each read that "data" could not be
  # restored (params_only never restores it).
  return Manager(checkpoint_dir(workdir), options=ocp.CheckpointManagerOptions(read_only=True),
                 item_handlers={"state": ocp.PyTreeCheckpointHandler(),
                                "data": grain.checkpoint.CheckpointHandler(),
                                "config": ocp.JsonCheckpointHandler()})


def restore(mngr: Manager, abstract_state, data_iter=None, step: int | None = None, config=None,
            set_aside_damaged: bool = False, params_only: bool = False):
  """Restores `state` (with the shardings of `abstract_state`) and, in place, the data iterator;
  returns (state, step).

  step=None takes the newest intact step: a damaged step (checksums that do not match, or no
  checksums and a failed restore) is skipped with a warning naming it and why, and moved into
  `checkpoints-set-aside/` when `set_aside_damaged` (the trainer; readers such as eval leave the
  directory as it is). An explicit `step` that is damaged is an error: the caller asked for it.
  A step whose checksums match but that does not restore is not damage: it raises, naming what
  differs when the model changed (`config`, the run's current config, gives the field names).
  params_only (a `reader` manager): `abstract_state` is {"params": ...} and only those arrays are
  read.
  """
  steps = sorted(mngr.all_steps())
  if step is not None and step not in steps:
    raise CheckpointError(f"no checkpoint for step {step} in {mngr.directory} (available: {steps})")
  if not steps:
    raise CheckpointError(f"no checkpoints in {mngr.directory}")
  damaged = []
  for candidate in [step] if step is not None else steps[::-1]:
    problem = verify(mngr, candidate)
    if problem == UNVERIFIED:
      log.warning("checkpoint step %d in %s has no %s (saved before checksums, or the run stopped "
                  "before writing them): restoring it unverified", candidate, mngr.directory, CHECKSUMS)
    restored = None
    if problem in (None, UNVERIFIED):
      # The saved metadata (one small read) tells a changed model before Orbax reads any array: a
      # doomed restore of a large step from a bucket would read much of it before failing.
      changed = _model_change(mngr, candidate, abstract_state, config, partial=params_only)
      if changed:
        raise CheckpointError(
            f"checkpoint step {candidate} in {mngr.directory} does not fit this run: the model / "
            f"config changed ({changed}); resume with the config saved in "
            f"{mngr.directory / str(candidate) / 'config'}, or train in a new workdir")
      try:
        restored = _restore_items(mngr, candidate, abstract_state, data_iter, params_only)
      except Exception as e:  # orbax raises many types for torn or mismatched files
        first_line = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
        if problem is None:
          raise CheckpointError(
              f"checkpoint step {candidate} in {mngr.directory} does not fit this run: its files "
              f"match their checksums, so it is not damaged ({first_line})") from e
        problem = f"it does not restore ({first_line})"
      if restored is not None and problem == UNVERIFIED:
        # Garbage bytes inside a compressed array file often still decode: without checksums, only
        # the values themselves can tell.
        implausible = implausibility(restored, abstract_state, candidate)
        if implausible:
          restored, problem = None, f"it has no {CHECKSUMS} and restores implausible values ({implausible})"
    if restored is not None:
      if damaged:
        log.warning("resuming from step %d, the newest intact checkpoint in %s (damaged: %s)",
                    candidate, mngr.directory, "; ".join(damaged))
      return restored, candidate
    where = set_aside(mngr, candidate, "damaged") if set_aside_damaged else None
    damaged.append(f"step {candidate}: {problem}" + (f", moved to {where}" if where else ""))
    log.warning("checkpoint step %d in %s is damaged: %s%s", candidate, mngr.directory, problem,
                f"; moved it to {where}" if where else "; skipping it")
    if step is not None:
      others = sorted(mngr.all_steps())
      raise CheckpointError(f"checkpoint step {step} in {mngr.directory} is damaged: {problem}"
                            + (f"; moved it to {where}" if where else "")
                            + f". Intact candidates: {others} (--config.train.restore_step=<step>, "
                            "or -1 for the newest intact one).")
  raise CheckpointError(f"no intact checkpoint in {mngr.directory}: " + "; ".join(damaged))


def implausibility(state, abstract_state, step: int | None = None) -> str:
  """What makes a restored `state` implausible ("" when nothing does): an array whose shape or
  dtype differs from `abstract_state`'s, a floating-point array holding NaN, inf or a value whose
  square overflows its dtype (|x| > 1.8e19 in float32), or a top-level `step` counter that is not
  `step`. The loop saves no such value: a step with a non-finite loss or gradient norm leaves the
  state unchanged, and a finite gradient norm bounds every gradient and so Adam's first moment;
  garbage bytes that still decode come out as values of 1e30 and beyond."""
  leaves = jax.tree_util.tree_leaves_with_path(state)
  targets = jax.tree_util.tree_leaves(abstract_state)
  if len(leaves) != len(targets):
    return f"{len(leaves)} arrays where the target has {len(targets)}"
  for (path, x), target in zip(leaves, targets):
    if (tuple(x.shape), x.dtype) != (tuple(target.shape), target.dtype):
      return (f"{_dotted(path)} is {x.dtype}{list(x.shape)}, the target "
              f"{target.dtype}{list(target.shape)}")
  bounded = jax.device_get([
      jnp.all(jnp.abs(x) <= math.sqrt(jnp.finfo(x.dtype).max))  # False for NaN too
      if jnp.issubdtype(x.dtype, jnp.inexact) else True for _, x in leaves])
  bad = [_dotted(path) for (path, _), ok in zip(leaves, bounded) if not ok]
  if bad:
    more = f" and {len(bad) - 1} more arrays" if len(bad) > 1 else ""
    return f"{bad[0]}{more} hold NaN, inf or values beyond 1e19"
  if step is not None and isinstance(state, dict) and "step" in state and int(state["step"]) != step:
    return f"its step counter reads {int(state['step'])}"
  return ""


def check_fresh_start(mngr: Manager, restore_step: int):
  """For a run about to start from step 0 in a workdir without checkpoints: a requested
  `restore_step` is an error (the run would silently train from scratch), and steps set aside
  earlier are named (a run whose every step was set aside starts over, and should say so)."""
  folder = mngr.directory.parent / SET_ASIDE
  aside = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []
  held = f"; {folder} holds {', '.join(aside)}" if aside else ""
  if restore_step >= 0:
    raise CheckpointError(f"config.train.restore_step={restore_step}, but {mngr.directory} holds no "
                          f"checkpoint{held}. Move a step back into {mngr.directory} to resume from "
                          "it, or use -1 to start from step 0")
  if aside:
    log.warning("no checkpoint in %s: training starts from step 0. Steps set aside earlier "
                "(damaged or rolled back) are in %s: %s; move one back into %s to resume from it",
                mngr.directory, folder, ", ".join(aside), mngr.directory)


def restore_config(workdir: str, step: int | None = None) -> dict:
  """The config a run saved with its checkpoint (for eval and distillation)."""
  mngr = ocp.CheckpointManager(checkpoint_dir(workdir),
                               item_handlers={"config": ocp.JsonCheckpointHandler()},
                               options=ocp.CheckpointManagerOptions(read_only=True))
  step = mngr.latest_step() if step is None else step
  if step is None:
    raise CheckpointError(f"no checkpoints under {workdir}/checkpoints")
  return mngr.restore(step, args=ocp.args.Composite(config=ocp.args.JsonRestore()))["config"]


def abstract(tree):
  """ShapeDtypeStructs with the shardings of `tree` (a restore target)."""
  return jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, tree)


# ------------------------------------------------------------------------------ helpers
def _restore_items(mngr: Manager, step: int, abstract_state, data_iter, params_only=False):
  if params_only:
    items = {"state": ocp.args.PyTreeRestore(
        item=abstract_state, partial_restore=True,
        restore_args=ocp.checkpoint_utils.construct_restore_args(abstract_state))}
  else:
    items = {"state": ocp.args.StandardRestore(abstract_state)}
  if data_iter is not None:
    items["data"] = grain.checkpoint.CheckpointRestore(data_iter)
  return mngr.restore(step, args=ocp.args.Composite(**items))["state"]


def _file_digests(step_dir: epath.Path) -> dict[str, list]:
  """{relative path: [size, sha256 hex]} of every file under `step_dir` but the checksums (through
  epath: local disk or an object store)."""
  out = {}
  for root, _, files in step_dir.walk():
    for name in files:
      path = epath.Path(root) / name
      rel = os.fspath(path.relative_to(step_dir))
      if rel != CHECKSUMS:
        out[rel] = list(storage.sha256(path))
  return out


def _write_json(path: epath.Path, obj):
  """Writes `obj` to `path` through a temporary file, so a reader sees all of it or nothing."""
  tmp = path.parent / f".{path.name}.tmp{os.getpid()}"
  tmp.write_text(json.dumps(obj, indent=1, sort_keys=True))
  tmp.rename(path)


def _flatten(d, prefix=""):
  out = {}
  for k, v in (d or {}).items():
    if isinstance(v, dict):
      out.update(_flatten(v, f"{prefix}{k}."))
    else:
      out[f"{prefix}{k}"] = v
  return out


def _dotted(path) -> str:
  """A tree path as Orbax names arrays ("params.blocks.0.mixer.q_proj.kernel.value"): the saved
  metadata has dict keys where the live state has sequence indices and attributes."""
  return ".".join(str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in path)


def _model_change(mngr: Manager, step: int, abstract_state, config, partial: bool = False) -> str:
  """What differs between step `step`'s saved state and this run's ("" when every array path and
  shape match, or the metadata is unreadable: a restore then says whether the step is damaged):
  the config.model fields that changed (when `config` is given), then the first array that
  differs. partial: `abstract_state` is a subtree (params only); arrays it lacks do not count."""
  try:
    stored = mngr.item_metadata(step)["state"]
    was = {_dotted(p): tuple(m.shape) for p, m in jax.tree_util.tree_leaves_with_path(stored)}
  except Exception as e:  # unreadable metadata: damage, not a model change
    log.debug("could not read the metadata of step %d: %s", step, e)
    return ""
  now = {_dotted(p): tuple(a.shape) for p, a in jax.tree_util.tree_leaves_with_path(abstract_state)}
  arrays = [f"{k} is {'new' if k not in was else 'gone'}" if k not in was or k not in now else
            f"{k} has shape {was[k]} in the checkpoint, {now[k]} now"
            for k in sorted(set(now) if partial else set(was) | set(now)) if was.get(k) != now.get(k)]
  if not arrays:
    return ""
  fields = []
  if config is not None:
    try:
      saved = mngr.restore(step, args=ocp.args.Composite(config=ocp.args.JsonRestore()))["config"]
    except Exception as e:  # a step saved without its config: the arrays alone say what changed
      log.debug("could not read the config of step %d: %s", step, e)
      saved = {}
    current = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    old, new = _flatten(saved.get("model")), _flatten(current.get("model"))
    if old:
      fields = [f"config.model.{k}: {old.get(k)!r} in the checkpoint, {new.get(k)!r} now"
                for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
  more = [f"{len(arrays) - 1} more arrays differ"] if len(arrays) > 1 else []
  return "; ".join(fields[:5] + arrays[:1] + more)
