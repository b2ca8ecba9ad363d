"""Retention (RetNet), token by token in float32: simple GLA with a fixed decay per head.

  S_t = gamma_h S_{t-1} + k_t v_t^T;  o_t = S_t^T (scale q_t);  gamma_h = 1 - 2 ** (-5 - h)
"""
from __future__ import annotations

import jax.numpy as jnp

from pallas_kernels.simple_gla.reference import fused_recurrent_simple_gla


def retention_log_decay(H: int):
  """log(1 - 2 ** (-5 - h)) for h = 0 .. H-1: the float32 g_gamma [H] of retention."""
  return jnp.log1p(-jnp.exp2(-5.0 - jnp.arange(H, dtype=jnp.float32)))


def fused_recurrent_retention(q, k, v, *, scale, initial_state, cu_seqlens=None):
  """Returns (o [B, T, H, V] in q.dtype, final_state [N, H, K, V] float32)."""
  return fused_recurrent_simple_gla(q, k, v, None, retention_log_decay(q.shape[2]), scale=scale,
                                    initial_state=initial_state, cu_seqlens=cu_seqlens)


chunk_retention = fused_recurrent_retention
