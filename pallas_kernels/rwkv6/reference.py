"""RWKV-6 (Finch) time mixing, token by token in float32: GLA that reads the state before its token.

  o_t = (S_{t-1} + diag(u) k_t v_t^T)^T (scale r_t);  S_t = diag(exp(w_t)) S_{t-1} + k_t v_t^T
"""
from __future__ import annotations

from pallas_kernels.gla.reference import fused_recurrent_gla


def fused_recurrent_rwkv6(r, k, v, w, u, *, scale, initial_state, cu_seqlens=None):
  """r, k [B, T, H, K]; v [B, T, H, V]; w [B, T, H, K] log decays; u [H, K] bonus.

  Returns (o [B, T, H, V] in r.dtype, final_state [N, H, K, V] float32).
  """
  return fused_recurrent_gla(r, k, v, w, scale=scale, initial_state=initial_state,
                             cu_seqlens=cu_seqlens, u=u)


chunk_rwkv6 = fused_recurrent_rwkv6
