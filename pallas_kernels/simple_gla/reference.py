"""Simple GLA (one scalar decay per head and step), token by token in float32: the definition.

  S_t = exp(g_t + g_gamma) S_{t-1} + k_t v_t^T;  o_t = S_t^T (scale q_t)

g [B, T, H] (data dependent, e.g. Mamba-2 SSD, gated RetNet) and g_gamma [H] (constant per head, e.g.
Lightning, RetNet) are both optional and add up; with neither it is plain linear attention.
"""
from __future__ import annotations

import jax.numpy as jnp

from pallas_kernels.gla.reference import fused_recurrent_gla


def scalar_gate(g, g_gamma, q):
  """g [B, T, H] and/or g_gamma [H] -> their float32 sum [B, T, H]; None when both are None."""
  if g is None and g_gamma is None:
    return None
  total = jnp.zeros(q.shape[:3], jnp.float32)
  for x in (g, g_gamma):
    total = total if x is None else total + x.astype(jnp.float32)
  return total


def fused_recurrent_simple_gla(q, k, v, g=None, g_gamma=None, *, scale, initial_state,
                               cu_seqlens=None):
  """Returns (o [B, T, H, V] in q.dtype, final_state [N, H, K, V] float32)."""
  return fused_recurrent_gla(q, k, v, scalar_gate(g, g_gamma, q), scale=scale,
                             initial_state=initial_state, cu_seqlens=cu_seqlens)


chunk_simple_gla = fused_recurrent_simple_gla
