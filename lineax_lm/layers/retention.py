"""Multi-scale retention (RetNet, Sun et al. 2023) as fla's `MultiScaleRetention` layer.

q/k/v projections (key dim D, value dim 2D), RoPE on q and k, fixed per-head decays
gamma_h = 1 - 2^(-5-h) (passed to simple GLA as g_gamma in training, so head-sharded calls keep
each head's own decay; as a decay per token with a cache), S = gamma S + k v^T, per-head RMSNorm
with a swish output gate, output projection.
"""
from __future__ import annotations

import dataclasses

import jax.numpy as jnp
from flax import nnx

from pallas_kernels.retention import retention_log_decay
from pallas_kernels.simple_gla import chunk_simple_gla, fused_recurrent_simple_gla

from lineax_lm.layers.base import LinearMixer, ctx_or_default
from lineax_lm.layers.common import Context, LayerSpec, MixerConfig, rope, run_op


@dataclasses.dataclass(frozen=True)
class RetentionConfig(MixerConfig):
  num_heads: int = 8
  expand_k: float = 1.0
  expand_v: float = 2.0
  use_short_conv: bool = False
  use_output_gate: bool = True
  rope_theta: float = 10000.0


class MultiScaleRetention(LinearMixer):
  """x: [B, L, D] -> ([B, L, D], new cache or None)."""

  def __init__(self, cfg: RetentionConfig, spec: LayerSpec, rngs: nnx.Rngs):
    self._setup(cfg, spec)
    D, H = spec.hidden, cfg.num_heads
    self._make_qkv(H, int(D * cfg.expand_k), int(D * cfg.expand_v), rngs)
    self._make_output(self.value_dim, self.head_v_dim, rngs, gate=cfg.use_output_gate)

  def __call__(self, x, cache=None, ctx: Context | None = None):
    cfg = self.cfg
    ctx = ctx_or_default(x, ctx)
    q, k, v, conv = self.qkv(x, cache, ctx)
    q, k = rope(q, ctx.positions, cfg.rope_theta), rope(k, ctx.positions, cfg.rope_theta)
    gamma = retention_log_decay(cfg.num_heads)
    if cache is None:  # training: the decays as constants
      args, decay, neutral = (q, k, v), {"g_gamma": gamma}, None
    else:  # with a cache, a decay per token, which a prompt's padding sets to 0 (run_op's neutral)
      args, decay, neutral = (q, k, v, jnp.broadcast_to(gamma, q.shape[:3])), {}, {1: 0.0, 3: 0.0}
    o, state = run_op(chunk_simple_gla, fused_recurrent_simple_gla, args, **decay,
                      state=self.state_of(cache), decode=self.decoding(x, cache),
                      packing=ctx.packing, backend=cfg.backend, neutral=neutral)
    return self.output(o, x), self.new_cache(cache, state, conv)
