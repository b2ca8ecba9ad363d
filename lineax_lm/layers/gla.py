"""Gated Linear Attention (Yang et al. 2024) as fla's `GatedLinearAttention` layer.

q/k/v projections (key dim 0.5 D, value dim D), a low-rank per-channel forget gate
g = logsigmoid(gk_proj(x)) / 16 with gk_proj = Linear(D, 16) -> Linear(16, key_dim, bias),
S = diag(exp(g)) S + k v^T, per-head RMSNorm with a swish output gate, output projection.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from pallas_kernels.gla import chunk_gla, fused_recurrent_gla

from lineax_lm.layers.base import LinearMixer
from lineax_lm.layers.common import F32, Context, LayerSpec, MixerConfig, dense, run_op, split_heads


@dataclasses.dataclass(frozen=True)
class GLAConfig(MixerConfig):
  num_heads: int = 4
  expand_k: float = 0.5
  expand_v: float = 1.0
  use_short_conv: bool = False
  use_output_gate: bool = True
  gate_logit_normalizer: float = 16.0
  gate_low_rank_dim: int = 16
  clamp_min: float | None = None


class GLA(LinearMixer):
  """x: [B, L, D] -> ([B, L, D], new cache or None)."""

  def __init__(self, cfg: GLAConfig, spec: LayerSpec, rngs: nnx.Rngs):
    self._setup(cfg, spec)
    D, H = spec.hidden, cfg.num_heads
    self._make_qkv(H, int(D * cfg.expand_k), int(D * cfg.expand_v), rngs)
    r = cfg.gate_low_rank_dim
    self.gk_proj = nnx.Sequential(
        dense(D, r, ("embed", "lowrank"), spec, rngs),
        dense(r, self.key_dim, ("lowrank", "heads"), spec, rngs, bias=True))
    self._make_output(self.value_dim, self.head_v_dim, rngs, gate=cfg.use_output_gate)

  def __call__(self, x, cache=None, ctx: Context | None = None):
    cfg = self.cfg
    q, k, v, conv = self.qkv(x, cache, ctx)
    g = jax.nn.log_sigmoid(self.gk_proj(x).astype(F32)) / cfg.gate_logit_normalizer
    if cfg.clamp_min is not None:
      g = jnp.maximum(g, cfg.clamp_min)
    o, state = run_op(chunk_gla, fused_recurrent_gla, (q, k, v, split_heads(g, self.head_k_dim)),
                      state=self.state_of(cache), decode=self.decoding(x, cache),
                      packing=ctx and ctx.packing, backend=cfg.backend,
                      neutral={1: 0.0, 3: 0.0})
    return self.output(o, x), self.new_cache(cache, state, conv)
