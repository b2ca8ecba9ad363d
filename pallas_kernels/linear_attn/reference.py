"""Linear attention, token by token in float32: simple GLA without decay.

  S_t = S_{t-1} + k_t v_t^T;  o_t = S_t^T (scale q_t)
"""
from __future__ import annotations

from pallas_kernels.simple_gla.reference import fused_recurrent_simple_gla


def fused_recurrent_linear_attn(q, k, v, *, scale, initial_state, cu_seqlens=None):
  """Returns (o [B, T, H, V] in q.dtype, final_state [N, H, K, V] float32)."""
  return fused_recurrent_simple_gla(q, k, v, None, None, scale=scale, initial_state=initial_state,
                                    cu_seqlens=cu_seqlens)


chunk_linear_attn = fused_recurrent_linear_attn

