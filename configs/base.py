"""The base config: a small Gated DeltaNet on MQAR.

    python -m lineax_lm.train --config configs/base.py --workdir runs/base

Every other config starts from `lineax_lm.train.config.base_config()` and overrides a few fields.
"""
from lineax_lm.train.config import base_config


def get_config():
  return base_config()
