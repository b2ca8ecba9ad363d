"""Tiny configurations shared by the layer and model tests (hidden 32, float32, xla backend)."""
from __future__ import annotations

import numpy as np

from lineax_lm.models.config import ModelConfig

HIDDEN = 32
# Per-mixer overrides that shrink fla's defaults to hidden 32 (2 heads of 16 where heads are set).
TINY_MIXER = {
    "attention": dict(num_heads=4, num_kv_heads=2),
    "linear_attn": dict(num_heads=2),
    "retention": dict(num_heads=2),
    "simple_gla": dict(num_heads=2),
    "mamba2": dict(num_heads=2),
    "gla": dict(num_heads=2, gate_low_rank_dim=8),
    "hgrn": dict(),
    "hgrn2": dict(expand_ratio=16),
    "deltanet": dict(num_heads=2),
    "gated_deltanet": dict(num_heads=2, head_dim=16),
    "kda": dict(num_heads=2, head_dim=16),
    "rwkv6": dict(num_heads=2, proj_low_rank_dim=8, gate_low_rank_dim=8),
    "mlstm": dict(num_heads=2),
}
# Weights at std 0.02 make tiny layers' outputs ~1e-6; a larger std gives O(1) activations, so that
# equality tests compare real signals.
INIT_STD = 0.2


def tiny_config(mixer: str = "gated_deltanet", **kw) -> ModelConfig:
  base = dict(vocab_size=64, num_layers=2, hidden=HIDDEN, heads=4, kv_heads=2, mlp_hidden=64,
              mixer="gated_deltanet" if mixer == "transformer" else mixer,
              mixer_cfg=TINY_MIXER.get(mixer, {}), backend="xla", init_std=INIT_STD,
              attn_ratio="transformer" if mixer == "transformer" else "pure")
  return ModelConfig(**{**base, **kw})


def tokens(shape, vocab=64, seed=0):
  return np.random.default_rng(seed).integers(0, vocab, shape).astype(np.int32)
