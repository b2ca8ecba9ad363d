"""Orbax checkpoints of everything a bit-for-bit resume needs.

Each step directory holds three items: `state` (model parameters, optimizer state, step and RNG
key data, saved asynchronously), `data` (the grain iterator's state) and `config` (JSON, for humans
and for `eval`/`distill` to rebuild the model). Restoring takes the target shardings from an
abstract state, so a run can resume on a different mesh.
"""
from __future__ import annotations

import os

import grain
import jax
import orbax.checkpoint as ocp


class CheckpointError(RuntimeError):
  pass


def manager(workdir: str, *, keep: int = 3, best_metric: str | None = None, best_mode: str = "min",
            async_save: bool = True) -> ocp.CheckpointManager:
  options = ocp.CheckpointManagerOptions(
      max_to_keep=keep, create=True, enable_async_checkpointing=async_save,
      best_fn=(lambda m: m[best_metric]) if best_metric else None, best_mode=best_mode,
      keep_checkpoints_without_metrics=True)
  return ocp.CheckpointManager(
      os.path.join(os.path.abspath(workdir), "checkpoints"), options=options,
      item_handlers={"state": ocp.StandardCheckpointHandler(), "data": grain.checkpoint.CheckpointHandler(),
                     "config": ocp.JsonCheckpointHandler()})


def save(mngr: ocp.CheckpointManager, step: int, state, data_iter=None, config=None, metrics=None,
         force: bool = False) -> bool:
  items = {"state": ocp.args.StandardSave(state)}
  if data_iter is not None:
    items["data"] = grain.checkpoint.CheckpointSave(data_iter)
  if config is not None:
    items["config"] = ocp.args.JsonSave(config.to_dict() if hasattr(config, "to_dict") else dict(config))
  return mngr.save(step, args=ocp.args.Composite(**items), metrics=metrics, force=force)


def restore(mngr: ocp.CheckpointManager, abstract_state, data_iter=None, step: int | None = None):
  """Restores `state` (with the shardings of `abstract_state`) and, in place, the data iterator.

  Raises CheckpointError naming the step directory when it is missing or unreadable; other
  checkpoints are left untouched.
  """
  steps = mngr.all_steps()
  step = mngr.latest_step() if step is None else step
  if step is None or step not in steps:
    raise CheckpointError(f"no checkpoint for step {step} in {mngr.directory} (available: {sorted(steps)})")
  items = {"state": ocp.args.StandardRestore(abstract_state)}
  if data_iter is not None:
    items["data"] = grain.checkpoint.CheckpointRestore(data_iter)
  try:
    restored = mngr.restore(step, args=ocp.args.Composite(**items))
  except Exception as e:  # orbax raises many types for torn or corrupt files
    raise CheckpointError(
        f"checkpoint step {step} in {mngr.directory} could not be restored ({type(e).__name__}: "
        f"{str(e).splitlines()[0][:300]}). It may be corrupt or incomplete; other steps "
        f"{sorted(s for s in steps if s != step)} are untouched: move the bad step directory aside "
        f"or pass --config.train.restore_step=<step>.") from e
  return restored["state"], step


def restore_config(workdir: str, step: int | None = None) -> dict:
  """The config a run saved with its checkpoint (for eval and distillation)."""
  mngr = ocp.CheckpointManager(os.path.join(os.path.abspath(workdir), "checkpoints"),
                               item_handlers={"config": ocp.JsonCheckpointHandler()},
                               options=ocp.CheckpointManagerOptions(read_only=True))
  step = mngr.latest_step() if step is None else step
  if step is None:
    raise CheckpointError(f"no checkpoints under {workdir}/checkpoints")
  return mngr.restore(step, args=ocp.args.Composite(config=ocp.args.JsonRestore()))["config"]


def abstract(tree):
  """ShapeDtypeStructs with the shardings of `tree` (a restore target)."""
  return jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, tree)
