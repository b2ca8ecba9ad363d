"""Rebuild a trained model from a training workdir: the config saved with the checkpoint, then the
parameters (`lineax_lm.train.checkpoint`), on a one-axis data mesh of the local devices.

  model, config, step = load_checkpoint("runs/x")            # latest step
  tokenizer = data_tokenizer(config)                          # None for MQAR runs
"""
from __future__ import annotations

import ml_collections
from flax import nnx

from lineax_lm import sharding
from lineax_lm.data.pipeline import make_tokenizer
from lineax_lm.models.hybrid import HybridLM, ModelConfig
from lineax_lm.train import checkpoint


def load_config(workdir: str, step: int | None = None) -> ml_collections.ConfigDict:
  """The training config saved with the checkpoint of `step` (latest when None)."""
  return ml_collections.ConfigDict(checkpoint.restore_config(workdir, step))


def load_checkpoint(workdir: str, step: int | None = None) -> tuple[HybridLM, ml_collections.ConfigDict, int]:
  """(model with the trained parameters, training config, restored step)."""
  from lineax_lm.train.trainer import Trainer  # the trainer's state layout is the checkpoint's
  config = load_config(workdir, step)
  config.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1, tensor=1))  # any device count
  model_cfg = ModelConfig.from_config(config.model)
  mesh = sharding.make_mesh(config.mesh)
  trainer = Trainer(config, model_cfg, mesh)
  mngr = checkpoint.manager(workdir, async_save=False)
  try:
    state, step = checkpoint.restore(mngr, trainer.abstract_state(), step=step)
  finally:
    mngr.close()
  model = nnx.merge(trainer.graphdef, state["params"])
  return model, config, int(step)


def data_tokenizer(config):
  """The tokenizer of a run's text data, or None when it trained on MQAR."""
  return None if config.data.source == "mqar" else make_tokenizer(config.data)
