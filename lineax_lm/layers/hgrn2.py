"""HGRN-2 (Qin et al. 2024) as fla's `HGRN2Attention` layer: HGRN with an outer-product state
expansion, run on `chunk_gla`.

H = D / expand_ratio heads of key dim expand_ratio: q = swish(q_proj(x)), g = lower-bounded
logsigmoid(f_proj(x)) (see hgrn.py), k = 1 - exp(g), v = i_proj(x); S = diag(exp(g)) S + k v^T;
output RMSNorm over the width, output projection.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from pallas_kernels.gla import chunk_gla, fused_recurrent_gla

from lineax_lm.layers.base import LinearMixer
from lineax_lm.layers.common import (Context, LayerSpec, MixerConfig, dense, merge_heads, run_op,
                                     split_heads)
from lineax_lm.layers.hgrn import lower_bounded


@dataclasses.dataclass(frozen=True)
class HGRN2Config(MixerConfig):
  expand_ratio: int = 128
  use_short_conv: bool = False


class HGRN2(LinearMixer):
  """x: [B, L, D] -> ([B, L, D], new cache or None); `lower_bound`: [forget_dim] from the model."""

  uses_lower_bound = True

  def __init__(self, cfg: HGRN2Config, spec: LayerSpec, rngs: nnx.Rngs):
    self._setup(cfg, spec)
    D, r = spec.hidden, cfg.expand_ratio
    if D % r:
      raise ValueError(f"HGRN2: hidden {D} must be divisible by `expand_ratio` {r}")
    self.num_heads = D // r
    self.forget_dim, self.head_f_dim, self.head_i_dim = self.num_heads * r, r, D // self.num_heads
    self.q_proj = dense(D, self.forget_dim, ("embed", "heads"), spec, rngs)
    self.f_proj = dense(D, self.forget_dim, ("embed", "heads"), spec, rngs)
    self.i_proj = dense(D, D, ("embed", "heads"), spec, rngs)
    if cfg.use_short_conv:
      for name, c in (("q", self.forget_dim), ("f", self.forget_dim), ("i", D)):
        self._make_conv(name, c, rngs, activation=None)
    self._make_output(D, D, rngs, gate=False)   # RMSNorm over the width, then o_proj
    self.state_shapes = ((self.num_heads, self.head_f_dim, self.head_i_dim),)

  def __call__(self, x, cache=None, ctx: Context | None = None, lower_bound=None):
    (q, f, i), conv = self.short_conv({"q": self.q_proj(x), "f": self.f_proj(x), "i": self.i_proj(x)},
                                      cache, ctx, fallback=None)
    g = lower_bounded(f, lower_bound)
    k = (-jnp.expm1(g)).astype(x.dtype)
    q, k, g = (split_heads(t, self.head_f_dim) for t in (jax.nn.silu(q), k, g))
    o, state = run_op(chunk_gla, fused_recurrent_gla, (q, k, split_heads(i, self.head_i_dim), g),
                      state=self.state_of(cache), decode=self.decoding(x, cache),
                      packing=ctx and ctx.packing, backend=self.cfg.backend,
                      neutral={1: 0.0, 3: 0.0})
    return self.output(merge_heads(o)[:, :, None, :], x), self.new_cache(cache, state, conv)
