"""DeltaNet (Schlag et al. 2021; Yang et al. 2024) as fla's `DeltaNet` layer.

q/k/v projections, short causal convolutions (width 4, SiLU), L2-normalised q and k, per-head
beta = sigmoid(b_proj(x)), S += k (beta (v - S^T k))^T, per-head output RMSNorm, output projection.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from pallas_kernels.common.chunk import l2norm
from pallas_kernels.delta_rule import chunk_delta_rule, fused_recurrent_delta_rule

from lineax_lm.layers.base import LinearMixer
from lineax_lm.layers.common import (F32, Context, LayerSpec, MixerConfig, dense, recomputed,
                                     run_op)


@dataclasses.dataclass(frozen=True)
class DeltaNetConfig(MixerConfig):
  num_heads: int = 4
  expand_k: float = 1.0
  expand_v: float = 1.0
  use_beta: bool = True
  use_gate: bool = False
  allow_neg_eigval: bool = False
  qk_activation: str = "silu"  # silu | relu | elu | identity
  qk_norm: str = "l2"          # l2 | sum


class DeltaNet(LinearMixer):
  """DeltaNet (Yang et al. 2024) as fla's `DeltaNet` layer."""

  def __init__(self, cfg: DeltaNetConfig, spec: LayerSpec, rngs: nnx.Rngs):
    self._setup(cfg, spec)
    if cfg.qk_activation not in ("silu", "relu", "elu", "identity"):
      raise ValueError("`qk_activation` must be silu, relu, elu or identity; "
                       f"got {cfg.qk_activation!r}")
    if cfg.qk_norm not in ("l2", "sum"):
      raise ValueError(f"`qk_norm` must be 'l2' or 'sum'; got {cfg.qk_norm!r}")
    D, H = spec.hidden, cfg.num_heads
    self._make_qkv(H, int(D * cfg.expand_k), int(D * cfg.expand_v), rngs,
                   qk_conv_act="silu" if cfg.qk_activation == "silu" else None)
    self.b_proj = dense(D, H, ("embed", None), spec, rngs) if cfg.use_beta else None
    self._make_output(self.value_dim, self.head_v_dim, rngs, gate=cfg.use_gate)

  def __call__(self, x, cache=None, ctx: Context | None = None):
    """x: [B, L, D] -> ([B, L, D], new cache or None)."""
    cfg = self.cfg
    q, k, v, conv = self.qkv(x, cache, ctx)
    if not cfg.use_short_conv:  # the convolutions apply these activations otherwise
      v = jax.nn.silu(v)
      if cfg.qk_activation == "silu":
        q, k = jax.nn.silu(q), jax.nn.silu(k)
    if cfg.qk_activation == "relu":
      q, k = jax.nn.relu(q), jax.nn.relu(k)
    elif cfg.qk_activation == "elu":
      q, k = jax.nn.elu(q) + 1, jax.nn.elu(k) + 1
    if cfg.qk_norm == "l2":
      q, k = recomputed(l2norm)(q), recomputed(l2norm)(k)
    else:
      q, k = q / jnp.sum(q, -1, keepdims=True), k / jnp.sum(k, -1, keepdims=True)
    beta = (jax.nn.sigmoid(self.b_proj(x).astype(F32)) if cfg.use_beta
            else jnp.ones(x.shape[:2] + (cfg.num_heads,), F32))
    if cfg.allow_neg_eigval:
      beta = beta * 2.0
    o, state = run_op(chunk_delta_rule, fused_recurrent_delta_rule, (q, k, v, beta.astype(q.dtype)),
                      state=self.state_of(cache), decode=self.decoding(x, cache),
                      packing=ctx and ctx.packing, backend=cfg.backend,
                      neutral={3: 0.0})
    return self.output(o, x), self.new_cache(cache, state, conv)
