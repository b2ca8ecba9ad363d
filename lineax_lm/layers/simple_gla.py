"""SimpleGLA / Mamba-2 style mixer: one scalar decay per head and step (fla's
`SimpleGatedLinearAttention`).

q/k/v projections (expand 1), short convolutions, S = exp(g) S + k v^T with
  gate="logsigmoid" (fla's default): g = logsigmoid(gk_proj(x)) / 16, gk_proj: Linear(D, H, bias);
  gate="mamba2": g = -exp(A_log) * softplus(gk_proj(x) + dt_bias) (Mamba-2's discretised decay, A_log
  and dt_bias initialised as Mamba-2 / Gated DeltaNet do, gk_proj without bias),
per-head RMSNorm with a swish output gate, output projection.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from pallas_kernels.simple_gla import chunk_simple_gla, fused_recurrent_simple_gla

from lineax_lm.layers.base import LinearMixer
from lineax_lm.layers.common import (F32, Context, LayerSpec, MixerConfig, a_log_init, dense,
                                     dt_bias_init, param, run_op)


@dataclasses.dataclass(frozen=True)
class SimpleGLAConfig(MixerConfig):
  num_heads: int = 4
  expand_k: float = 1.0
  expand_v: float = 1.0
  gate: str = "logsigmoid"  # logsigmoid | mamba2
  gate_logit_normalizer: float = 16.0


class SimpleGLA(LinearMixer):
  """x: [B, L, D] -> ([B, L, D], new cache or None)."""

  def __init__(self, cfg: SimpleGLAConfig, spec: LayerSpec, rngs: nnx.Rngs):
    self._setup(cfg, spec)
    if cfg.gate not in ("logsigmoid", "mamba2"):
      raise ValueError(f"`gate` must be 'logsigmoid' or 'mamba2'; got {cfg.gate!r}")
    D, H = spec.hidden, cfg.num_heads
    self._make_qkv(H, int(D * cfg.expand_k), int(D * cfg.expand_v), rngs)
    mamba2 = cfg.gate == "mamba2"
    self.gk_proj = dense(D, H, ("embed", None), spec, rngs, bias=not mamba2)
    if mamba2:
      self.A_log = param(rngs, a_log_init(1.0, 16.0), (H,), (None,), spec.param_dtype)
      self.dt_bias = param(rngs, dt_bias_init(), (H,), (None,), spec.param_dtype)
    self._make_output(self.value_dim, self.head_v_dim, rngs)

  def __call__(self, x, cache=None, ctx: Context | None = None):
    cfg = self.cfg
    q, k, v, conv = self.qkv(x, cache, ctx)
    a = self.gk_proj(x).astype(F32)
    if cfg.gate == "mamba2":
      g = -jnp.exp(self.A_log[...].astype(F32)) * jax.nn.softplus(a + self.dt_bias[...].astype(F32))
    else:
      g = jax.nn.log_sigmoid(a) / cfg.gate_logit_normalizer
    o, state = run_op(chunk_simple_gla, fused_recurrent_simple_gla, (q, k, v, g),
                      state=self.state_of(cache), decode=self.decoding(x, cache),
                      packing=ctx and ctx.packing, backend=cfg.backend,
                      neutral={1: 0.0, 3: 0.0})
    return self.output(o, x), self.new_cache(cache, state, conv)
