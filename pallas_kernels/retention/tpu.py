"""Retention on TPU: the simple-GLA TPU kernel with g_gamma = log(1 - 2 ** (-5 - h))."""
from __future__ import annotations

from pallas_kernels.retention.reference import retention_log_decay
from pallas_kernels.simple_gla.tpu import chunk_simple_gla


def chunk_retention(q, k, v, *, scale, initial_state=None, cu_seqlens=None, interpret=False):
  """q, k [B, T, H, K]; v [B, T, H, V]. Returns (o [B, T, H, V] in q.dtype, final_state f32)."""
  return chunk_simple_gla(q, k, v, None, retention_log_decay(q.shape[2]), scale=scale,
                          initial_state=initial_state, cu_seqlens=cu_seqlens, interpret=interpret)
