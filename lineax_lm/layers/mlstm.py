"""mLSTM (xLSTM, Beck et al. 2024) as fla's `MLSTM` layer.

Up-projection to 2 x inner (inner = 2 D rounded up to a multiple of 64): an mLSTM branch and a gate
branch z. The mLSTM branch goes through a short convolution (SiLU, with bias); q and k are
block-diagonal projections (blocks of 4) of the convolved branch, v of the raw branch; per-head input
and forget gate pre-activations come from [q, k, v]. `qkv_proj="dense"` instead projects q, k and v
densely from the layer input (D -> inner each, as xLSTM-7B's mLSTM layer and as softmax attention
do), so a Transformer's q/k/v projections can initialise them (lineax_lm.distill); the convolved
branch then only feeds the learnable skip. The op runs the stabilised recurrence (state
(C, n, m)); a per-head LayerNorm, a learnable skip from the convolved branch, times silu(z), and a
down-projection follow.
"""
from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from flax import nnx

from pallas_kernels.mlstm import chunk_mlstm, fused_recurrent_mlstm

from lineax_lm.layers.base import LinearMixer
from lineax_lm.layers.common import (F32, Context, LayerSpec, GroupNorm, MixerConfig, dense, param,
                                     residual_dense, run_op, split_heads)


@dataclasses.dataclass(frozen=True)
class MLSTMConfig(MixerConfig):
  num_heads: int = 16
  proj_factor: float = 2.0
  qkv_proj_blocksize: int = 4
  round_to: int = 64
  conv_bias: bool = True
  qkv_proj: str = "blockdiag"  # "blockdiag" (xLSTM's layout) | "dense" (D -> inner from the input)


QKV_PROJ = ("blockdiag", "dense")


class GroupedLinear(nnx.Module):
  """Block-diagonal linear map: [..., G * b] -> [..., G * b] with G independent b x b blocks."""

  def __init__(self, features: int, block: int, spec: LayerSpec, rngs):
    self.block = block
    self.weight = param(rngs, nnx.initializers.normal(spec.init_std),
                        (features // block, block, block), ("heads", None, None), spec.param_dtype)

  def __call__(self, x):
    xb = x.reshape(*x.shape[:-1], -1, self.block)
    return jnp.einsum("...gi,gio->...go", xb, self.weight[...].astype(x.dtype)).reshape(x.shape)


class MLSTM(LinearMixer):
  """x: [B, L, D] -> ([B, L, D], new cache or None)."""

  def __init__(self, cfg: MLSTMConfig, spec: LayerSpec, rngs: nnx.Rngs):
    self._setup(cfg, spec)
    D, H = spec.hidden, cfg.num_heads
    inner = int(math.ceil(cfg.proj_factor * D / cfg.round_to) * cfg.round_to)
    if inner % H or inner % cfg.qkv_proj_blocksize:
      raise ValueError(f"mLSTM inner width {inner} must be divisible by `num_heads` {H} and "
                       f"`qkv_proj_blocksize` {cfg.qkv_proj_blocksize}")
    if cfg.qkv_proj not in QKV_PROJ:
      raise ValueError(f"mLSTM `qkv_proj` must be one of {QKV_PROJ}; got {cfg.qkv_proj!r}")
    self.inner, self.head_dim = inner, inner // H
    self.proj_up = dense(D, 2 * inner, ("embed", "heads"), spec, rngs)
    self._make_conv("x", inner, rngs, activation="silu")
    for name in ("q_proj", "k_proj", "v_proj"):
      setattr(self, name, dense(D, inner, ("embed", "heads"), spec, rngs) if cfg.qkv_proj == "dense"
              else GroupedLinear(inner, cfg.qkv_proj_blocksize, spec, rngs))
    # xLSTM's gate init: zero weights, input-gate bias ~ N(0, 0.1), forget-gate bias linspace(3, 6).
    zeros = nnx.initializers.zeros
    self.igate = dense(3 * inner, H, ("heads", None), spec, rngs, bias=True, kernel_init=zeros)
    self.fgate = dense(3 * inner, H, ("heads", None), spec, rngs, bias=True, kernel_init=zeros)
    self.igate.bias = param(rngs, nnx.initializers.normal(0.1), (H,), (None,), spec.param_dtype)
    self.fgate.bias = param(rngs, lambda k, s, d: jnp.linspace(3.0, 6.0, s[0], dtype=d), (H,), (None,),
                            spec.param_dtype)
    self.o_norm = GroupNorm(H, inner, cfg.norm_eps, spec, rngs, bias=False)
    self.learnable_skip = param(rngs, nnx.initializers.ones, (inner,), ("heads",), spec.param_dtype)
    self.proj_down = residual_dense(inner, D, ("heads", "embed"), spec, rngs)
    d = self.head_dim
    self.state_shapes = ((H, d, d), (H, d), (H,))

  def __call__(self, x, cache=None, ctx: Context | None = None):
    x_m, z = jnp.split(self.proj_up(x), 2, axis=-1)
    (x_c,), conv = self.short_conv({"x": x_m}, cache, ctx)
    if self.cfg.qkv_proj == "dense":
      q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
    else:
      q, k, v = self.q_proj(x_c), self.k_proj(x_c), self.v_proj(x_m)
    gate_in = jnp.concatenate([q, k, v], axis=-1)
    i, f = self.igate(gate_in).astype(F32), self.fgate(gate_in).astype(F32)
    q, k, v = (split_heads(t, self.head_dim) for t in (q, k, v))
    h, state = run_op(chunk_mlstm, fused_recurrent_mlstm, (q, k, v, i, f), state=self.state_of(cache),
                      decode=self.decoding(x, cache), packing=ctx and ctx.packing,
                      backend=self.cfg.backend,
                      # a padding token: input gate exp(-1e30) = 0, forget gate sigmoid(1e30) = 1
                      # (finite: the stabiliser's max never subtracts inf from inf)
                      neutral={3: -1e30, 4: 1e30})
    h = self.o_norm(h.reshape(x_c.shape)) + self.learnable_skip[...].astype(x.dtype) * x_c
    return self.proj_down(h * jax.nn.silu(z)), self.new_cache(cache, state, conv)
