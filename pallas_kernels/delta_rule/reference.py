"""The delta rule, token by token in float32: the gated delta rule's definition with g = 0.

  u_t = beta_t (v_t - S_{t-1}^T k_t);  S_t = S_{t-1} + k_t u_t^T;  o_t = S_t^T (scale q_t)
"""
from __future__ import annotations

from pallas_kernels.gated_delta_rule import reference as gdn


def fused_recurrent_delta_rule(q, k, v, beta, *, scale, initial_state, cu_seqlens=None):
  """q, k [B, T, H, K]; v [B, T, H, V]; beta [B, T, H].

  Returns (o [B, T, H, V] in q.dtype, final_state [N, H, K, V] float32).
  """
  return gdn.fused_recurrent_gated_delta_rule(q, k, v, None, beta, scale=scale,
                                              initial_state=initial_state, cu_seqlens=cu_seqlens)


chunk_delta_rule = fused_recurrent_delta_rule
