"""RWKV-6 "Finch" time mixing as fla's `RWKV6Attention` layer (fla's simplified form).

Token shift with data-dependent interpolation (ddlerp): delta = x_{t-1} - x_t;
m = tanh(lerp(x, delta; mu) W_down) W_up + x_bias gives five mixing vectors (r, w, k, v, g);
each projection sees x + delta * m_*. r/k: key dim 0.5 D, v/g: D; the decay w comes from a
low-rank tanh LoRA, w = -exp(w). S = diag(exp(w_t)) S + k_t v_t^T, o_t = (S_{t-1} + diag(u) k v^T)^T r_t
(scale 1); per-head LayerNorm (GroupNorm) times swish(g), output projection. The cache keeps the
last input x_{t-1} (token-shift state) and the recurrent state.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from pallas_kernels.rwkv6 import chunk_rwkv6, fused_recurrent_rwkv6

from lineax_lm.layers.base import LinearMixer, reset_ids_of
from lineax_lm.layers.common import (F32, Context, LayerSpec, GroupNorm, MixerConfig, causal_taps,
                                     dense, param, run_op, split_heads)

_MIXES = ("r", "w", "k", "v", "g")


@dataclasses.dataclass(frozen=True)
class RWKV6Config(MixerConfig):
  num_heads: int = 4
  expand_k: float = 0.5
  expand_v: float = 1.0
  proj_low_rank_dim: int = 32
  gate_low_rank_dim: int = 64
  use_short_conv: bool = False


def _xavier(scale: float = 1.0, in_axis=-2):
  """fla's xavier_uniform with gain 2^-2.5, times `scale` (variance_scaling's scale is the squared
  gain); in_axis: the input axes of a kernel whose input is more than one axis."""
  return nnx.initializers.variance_scaling(2 ** -5 * scale ** 2, "fan_avg", "uniform",
                                           in_axis=in_axis, out_axis=-1)


class RWKV6(LinearMixer):
  """x: [B, L, D] -> ([B, L, D], new cache or None)."""

  def __init__(self, cfg: RWKV6Config, spec: LayerSpec, rngs: nnx.Rngs):
    self._setup(cfg, spec)
    D, H, R = spec.hidden, cfg.num_heads, cfg.proj_low_rank_dim
    self.key_dim, self.value_dim = int(D * cfg.expand_k), int(D * cfg.expand_v)
    if self.key_dim % H or self.value_dim % H:
      raise ValueError(f"RWKV6: key dim {self.key_dim} and value dim {self.value_dim} must be "
                       f"divisible by `num_heads` = {H}")
    self.head_k_dim, self.head_v_dim = self.key_dim // H, self.value_dim // H
    zeros = nnx.initializers.zeros
    # fla's initialisation of this layer (whatever init_std says): every projection
    # xavier_uniform with gain 2^-2.5, the decay's LoRA down-projection zero and its
    # up-projection orthogonal with gain 0.1 (so the decay starts data-independent), mu, x_bias
    # and bonus zero.
    dense_ = lambda din, dout, axes: dense(din, dout, axes, spec, rngs, kernel_init=_xavier())
    G = cfg.gate_low_rank_dim
    self.x_mu = param(rngs, zeros, (D,), ("embed",), spec.param_dtype)
    self.x_down = dense_(D, 5 * R, ("embed", "lowrank"))
    self.x_up = param(rngs, _xavier(in_axis=(0, 1)), (5, R, D), (None, "lowrank", "embed"),
                      spec.param_dtype)  # fla's Linear 5 R -> D
    self.x_bias = param(rngs, zeros, (5, D), (None, "embed"), spec.param_dtype)
    self.r_proj = dense_(D, self.key_dim, ("embed", "heads"))
    up_gain = 0.1 * (G / self.key_dim) ** 0.5 if G > self.key_dim else 0.1
    self.w_proj = nnx.Sequential(
        dense(D, G, ("embed", "lowrank"), spec, rngs, kernel_init=zeros), jnp.tanh,
        dense(G, self.key_dim, ("lowrank", "heads"), spec, rngs, bias=True,
              kernel_init=nnx.initializers.orthogonal(up_gain)))
    self.k_proj = dense_(D, self.key_dim, ("embed", "heads"))
    self.v_proj = dense_(D, self.value_dim, ("embed", "heads"))
    self.g_proj = dense_(D, self.value_dim, ("embed", "heads"))
    self.bonus = param(rngs, zeros, (H, self.head_k_dim), (None, None), spec.param_dtype)
    self.g_norm = GroupNorm(H, self.value_dim, cfg.norm_eps, spec, rngs, bias=True)
    # ModelConfig.residual_init="rescale" scales the output projection's init
    self.o_proj = dense(self.value_dim, D, ("heads", "embed"), spec, rngs,
                        kernel_init=_xavier(spec.residual_scale))
    self.conv_states = (("shift", 1, D),)
    self.state_shapes = ((H, self.head_k_dim, self.head_v_dim),)

  def __call__(self, x, cache=None, ctx: Context | None = None):
    B, L, D = x.shape
    (_, prev), shift = causal_taps(x, 2, None if cache is None else cache["conv"]["shift"],
                                   reset_ids_of(ctx))
    delta = prev - x
    m = jnp.tanh(self.x_down(x + delta * self.x_mu[...].astype(x.dtype)))
    m = jnp.einsum("blnr,nrd->blnd", m.reshape(B, L, 5, -1), self.x_up[...].astype(x.dtype))
    m = m + self.x_bias[...].astype(x.dtype)
    xs = {name: x + delta * m[:, :, n] for n, name in enumerate(_MIXES)}
    r, k = self.r_proj(xs["r"]), self.k_proj(xs["k"])
    w = -jnp.exp(self.w_proj(xs["w"]).astype(F32))
    v, g = self.v_proj(xs["v"]), self.g_proj(xs["g"])
    r, w, k = (split_heads(t, self.head_k_dim) for t in (r, w, k))
    o, state = run_op(chunk_rwkv6, fused_recurrent_rwkv6, (r, k, split_heads(v, self.head_v_dim), w),
                      u=self.bonus[...].astype(x.dtype), scale=1.0, state=self.state_of(cache),
                      decode=self.decoding(x, cache), packing=ctx and ctx.packing,
                      backend=self.cfg.backend, neutral={1: 0.0, 3: 0.0})
    o = self.g_norm(o.reshape(B, L, -1)) * jax.nn.silu(g)
    return self.o_proj(o), self.new_cache(cache, state, {"shift": shift})
