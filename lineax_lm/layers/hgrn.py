"""HGRN (Qin et al. 2023) as fla's `HGRNAttention` layer: an elementwise gated linear RNN.

f = logsigmoid(f_proj(x)), raised by the model's per-layer lower bound lb (which grows with depth):
f = log(lb + (1 - lb) sigmoid(.)); i = silu(i_proj(x)) * (1 - exp(f)); h_t = exp(f_t) h_{t-1} + i_t;
output RMSNorm over the width with a swish gate g_proj(x), output projection.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from pallas_kernels.hgrn import chunk_hgrn, fused_recurrent_hgrn

from lineax_lm.layers.base import LinearMixer
from lineax_lm.layers.common import F32, Context, LayerSpec, MixerConfig, dense, run_op


@dataclasses.dataclass(frozen=True)
class HGRNConfig(MixerConfig):
  expand_ratio: int = 1
  use_short_conv: bool = False


def lower_bounded(f_logits, lower_bound):
  """log of a forget gate lb + (1 - lb) * sigmoid(f_logits), in float32 (None: no bound; the model
  passes None to its first layer, whose bound is 0, or 0 itself when its layers run as a scan).
  A bound of exactly 0 gives log sigmoid(f_logits) with finite gradients (log 0 is kept out of the
  differentiated path: its infinite derivative times a zero tangent would be NaN)."""
  f = jax.nn.log_sigmoid(f_logits.astype(F32))
  if lower_bound is None:
    return f
  lb = lower_bound.astype(F32)
  log_lb = jnp.where(lb > 0, jnp.log(jnp.where(lb > 0, lb, 1.0)), -jnp.inf)
  return jnp.minimum(jnp.logaddexp(log_lb, jnp.log1p(-lb) + f), 0.0)  # rounding can exceed 0


class HGRN(LinearMixer):
  """x: [B, L, D] -> ([B, L, D], new cache or None); `lower_bound`: [width] from the model."""

  uses_lower_bound = True

  def __init__(self, cfg: HGRNConfig, spec: LayerSpec, rngs: nnx.Rngs):
    self._setup(cfg, spec)
    D = spec.hidden
    self.width = self.forget_dim = int(D * cfg.expand_ratio)
    self.i_proj = dense(D, self.width, ("embed", "heads"), spec, rngs)
    self.f_proj = dense(D, self.width, ("embed", "heads"), spec, rngs)
    if cfg.use_short_conv:
      self._make_conv("i", self.width, rngs, activation=None)
      self._make_conv("f", self.width, rngs, activation=None)
    self._make_output(self.width, self.width, rngs)   # one "head" spanning the width
    self.state_shapes = ((self.width,),)

  def __call__(self, x, cache=None, ctx: Context | None = None, lower_bound=None):
    (i, f), conv = self.short_conv({"i": self.i_proj(x), "f": self.f_proj(x)}, cache, ctx,
                                   fallback=None)
    f = lower_bounded(f, lower_bound)
    i = (jax.nn.silu(i.astype(F32)) * -jnp.expm1(f)).astype(x.dtype)
    o, state = run_op(chunk_hgrn, fused_recurrent_hgrn, (i, f), state=self.state_of(cache),
                      decode=self.decoding(x, cache), packing=ctx and ctx.packing,
                      backend=self.cfg.backend, neutral={0: 0.0, 1: 0.0})
    return self.output(o[:, :, None, :], x), self.new_cache(cache, state, conv)
