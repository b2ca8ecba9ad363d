"""Language-model pretraining on text with a preset model and a token budget
(lineax_lm.train.config.lm_config):

    python -m lineax_lm.train --config configs/lm.py --workdir runs/gdn_6to1 \
        --config.model.preset=gated_deltanet_340m --config.model.attn_ratio=6:1 \
        --config.train.tokens=20_000_000_000 --config.data.source=parquet \
        --config.data.paths='fineweb-edu/sample/10BT/*.parquet' --config.data.tokenizer=tokenizer.json

`--config configs/lm.py:PRESET` names the preset in the argument instead. Presets: python -m
lineax_lm.models.presets. The held-out split: --config.data.heldout_fraction (default 1%) or
--config.data.heldout_paths.
"""
from lineax_lm.train.config import lm_config


def get_config(preset: str = "gated_deltanet_340m"):
  return lm_config(preset=preset)
