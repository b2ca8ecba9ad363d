"""Kimi Delta Attention as fla's `KimiDeltaAttention` layer.

Gated DeltaNet with a per-channel decay g = -exp(A_log[h]) * softplus(f_proj(x) + dt_bias) from a
low-rank f_proj, a low-rank output gate and a sigmoid-gated per-head output RMSNorm.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from pallas_kernels.common.chunk import l2norm
from pallas_kernels.kda import chunk_kda, fused_recurrent_kda

from lineax_lm.layers.base import LinearMixer
from lineax_lm.layers.common import (F32, Context, LayerSpec, MixerConfig, a_log_init, check_expand,
                                     dense, param, recomputed, run_op, split_heads)


@dataclasses.dataclass(frozen=True)
class KDAConfig(MixerConfig):
  num_heads: int = 16
  head_dim: int = 128
  expand_v: float = 1.0
  allow_neg_eigval: bool = False


class KDA(LinearMixer):
  """Kimi Delta Attention as fla's `KimiDeltaAttention` layer: GDN with a per-channel decay and a
  low-rank output gate, sigmoid-gated output norm."""

  def __init__(self, cfg: KDAConfig, spec: LayerSpec, rngs: nnx.Rngs):
    self._setup(cfg, spec)
    D, H = spec.hidden, cfg.num_heads
    self._make_qkv(H, H * cfg.head_dim, H * check_expand("KDA", cfg.head_dim, cfg.expand_v), rngs)
    r = self.head_v_dim
    self.f_proj = nnx.Sequential(dense(D, r, ("embed", "lowrank"), spec, rngs),
                                 dense(r, self.key_dim, ("lowrank", "heads"), spec, rngs))
    self.b_proj = dense(D, H, ("embed", None), spec, rngs)
    self.A_log = param(rngs, a_log_init(1.0, 16.0), (H,), (None,), spec.param_dtype)
    self.dt_bias = param(rngs, nnx.initializers.zeros, (self.key_dim,), ("heads",),
                         spec.param_dtype)
    g_proj = nnx.Sequential(dense(D, r, ("embed", "lowrank"), spec, rngs),
                            dense(r, self.value_dim, ("lowrank", "heads"), spec, rngs, bias=True))
    self._make_output(self.value_dim, self.head_v_dim, rngs, activation="sigmoid", g_proj=g_proj)

  def __call__(self, x, cache=None, ctx: Context | None = None):
    """x: [B, L, D] -> ([B, L, D], new cache or None)."""
    cfg = self.cfg
    q, k, v, conv = self.qkv(x, cache, ctx, fallback=jax.nn.silu)
    q, k = recomputed(l2norm)(q), recomputed(l2norm)(k)
    g = jax.nn.softplus(self.f_proj(x).astype(F32) + self.dt_bias[...].astype(F32))
    g = -jnp.exp(self.A_log[...].astype(F32))[:, None] * split_heads(g, self.head_k_dim)
    beta = jax.nn.sigmoid(self.b_proj(x).astype(F32)) * (2.0 if cfg.allow_neg_eigval else 1.0)
    o, state = run_op(chunk_kda, fused_recurrent_kda, (q, k, v, g, beta.astype(q.dtype)),
                      state=self.state_of(cache), decode=self.decoding(x, cache),
                      packing=ctx and ctx.packing, backend=cfg.backend,
                      neutral={3: 0.0, 4: 0.0})
    return self.output(o, x), self.new_cache(cache, state, conv)
