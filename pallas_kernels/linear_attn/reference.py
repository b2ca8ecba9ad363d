"""Linear attention, token by token in float32: simple GLA without decay, plus fla's normalizer.

  S_t = S_{t-1} + k_t v_t^T;  o_t = S_t^T (scale q_t)
  normalize=True:  o_t / (scale q_t . sum_{s <= t} k_s + 1e-10), the sum over o_t's own sequence
"""
from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from pallas_kernels.common.varlen import token_segments
from pallas_kernels.simple_gla.reference import fused_recurrent_simple_gla

F32 = jnp.float32


def fused_recurrent_linear_attn(q, k, v, *, scale, initial_state, cu_seqlens=None):
  """Returns (o [B, T, H, V] in q.dtype, final_state [N, H, K, V] float32)."""
  return fused_recurrent_simple_gla(q, k, v, None, None, scale=scale, initial_state=initial_state,
                                    cu_seqlens=cu_seqlens)


chunk_linear_attn = fused_recurrent_linear_attn


def normalize_output(o, q, k, scale, cu_seqlens=None, eps: float = 1e-10):
  """o [B, T, H, V] / (scale q_t . z_t + eps), z_t = sum_{s <= t} k_s over the tokens of this call
  (restarting at each cu_seqlens boundary; the initial state plays no part). Float32 inside,
  returned in o.dtype. q, k: [B, T, H, K]."""
  k = k.astype(F32)
  if cu_seqlens is None:
    z = jnp.cumsum(k, axis=1)
  else:  # a cumsum that restarts where a sequence starts
    starts = (token_segments(cu_seqlens, k.shape[1]).starts >= 0)[None, :, None, None]
    combine = lambda a, b: (a[0] | b[0], jnp.where(b[0], b[1], a[1] + b[1]))
    _, z = lax.associative_scan(combine, (starts, k), axis=1)
  den = jnp.sum(q.astype(F32) * scale * z, axis=-1, keepdims=True) + eps
  return (o.astype(F32) / den).astype(o.dtype)
