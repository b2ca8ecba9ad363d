"""RWKV-6 channel mixing: the feed-forward of fla's RWKV-6 blocks (fla's `RWKV6FeedForward`), with a
token shift of its own.

    delta = x_{t-1} - x_t                        (x_{-1} = the cached last input, or 0)
    y = value(relu(key(x + delta * mu_k))^2) * sigmoid(receptance(x + delta * mu_r))

key: D -> width, value: width -> D, receptance: D -> D, each bias-free; mu_k, mu_r per channel.
Decoding keeps the last input [B, 1, D] (the shift state) per layer.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from lineax_lm.layers.common import LayerSpec, causal_taps, dense, param, residual_dense


def channel_mix_width(hidden: int, ratio: float = 3.5) -> int:
  """fla's RWKV6FeedForward rule: int(hidden * ratio) rounded up to a multiple of 32."""
  n = int(hidden * ratio)
  return 32 * ((n + 31) // 32)


class LerpLinear(nnx.Module):
  """fla's LerpLinear: linear(x + delta * mu), a projection of the input moved towards the previous
  token by a learned per-channel amount mu (zero at init, as in fla: the input itself)."""

  def __init__(self, din: int, dout: int, axes, spec: LayerSpec, rngs):
    self.mu = param(rngs, nnx.initializers.zeros, (din,), (axes[0],), spec.param_dtype)
    self.linear = dense(din, dout, axes, spec, rngs)

  def __call__(self, x, delta):
    return self.linear(x + delta * self.mu[...].astype(x.dtype))


class RWKV6ChannelMix(nnx.Module):
  """x [B, L, D] -> (y [B, L, D], new shift state [B, 1, D]: the last input). `state`: the input
  before x (decoding), None at a sequence start; `reset_ids` [B, L]: packed sequences, the shift
  never crosses a change of id. Weights normal(init_std) (value, which writes into the residual
  stream, scaled as ModelConfig.residual_init says), mu zero: fla's initialisation."""

  def __init__(self, hidden: int, width: int, spec: LayerSpec, rngs):
    self.key = LerpLinear(hidden, width, ("embed", "mlp"), spec, rngs)
    self.value = residual_dense(width, hidden, ("mlp", "embed"), spec, rngs)
    self.receptance = LerpLinear(hidden, hidden, ("embed", None), spec, rngs)

  def __call__(self, x, state=None, reset_ids=None):
    (_, prev), shift = causal_taps(x, 2, state, reset_ids)
    delta = prev - x
    key = jnp.square(jax.nn.relu(self.key(x, delta)))
    return self.value(key) * jax.nn.sigmoid(self.receptance(x, delta)), shift
