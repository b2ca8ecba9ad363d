"""Chunked retention in pure JAX: chunked simple GLA with g_gamma = log(1 - 2 ** (-5 - h))."""
from __future__ import annotations

from pallas_kernels.retention.reference import fused_recurrent_retention, retention_log_decay  # noqa: F401
from pallas_kernels.simple_gla.xla import chunk_simple_gla


def chunk_retention(q, k, v, *, scale, initial_state, cu_seqlens=None):
  """q, k [B, T, H, K]; v [B, T, H, V]. Returns (o [B, T, H, V] in q.dtype, final_state f32)."""
  return chunk_simple_gla(q, k, v, None, retention_log_decay(q.shape[2]), scale=scale,
                          initial_state=initial_state, cu_seqlens=cu_seqlens)
