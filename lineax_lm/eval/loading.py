"""Rebuild a trained model from a training workdir: the config saved with the checkpoint, then the
parameters (`lineax_lm.train.checkpoint`), on a one-axis data mesh of the local devices.

  model, config, step = load_checkpoint("runs/x")            # latest step
  tokenizer = data_tokenizer(config)                          # None for MQAR runs
"""
from __future__ import annotations

import ml_collections
from lineax_lm.data.pipeline import make_tokenizer
from lineax_lm.models.hybrid import HybridLM
from lineax_lm.train import checkpoint


def load_config(workdir: str, step: int | None = None) -> ml_collections.ConfigDict:
  """The training config saved with the checkpoint of `step` (latest when None)."""
  return ml_collections.ConfigDict(checkpoint.restore_config(workdir, step))


def load_checkpoint(workdir: str, step: int | None = None) -> tuple[HybridLM, ml_collections.ConfigDict, int]:
  """(model with the trained parameters, training config, restored step); only the parameters are
  read (lineax_lm.models.pretrained.load_run)."""
  from lineax_lm.models.pretrained import load_run
  loaded = load_run(workdir, step)
  return loaded.model, loaded.config, loaded.step


def data_tokenizer(config):
  """The tokenizer of a run's text data, or None when it trained on MQAR."""
  return None if config.data.source == "mqar" else make_tokenizer(config.data)
