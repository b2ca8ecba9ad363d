"""Retention on TPU: the additive-class Mosaic kernel (pallas_kernels/gla/tpu.py) with the fixed
scalar gate g_gamma = log(1 - 2 ** (-5 - h)) per head, as simple GLA passes it."""
from __future__ import annotations

from pallas_kernels.gla.tpu import chunk_additive
from pallas_kernels.retention.reference import retention_log_decay
from pallas_kernels.simple_gla.reference import scalar_gate


def chunk_retention(q, k, v, *, scale, initial_state, cu_seqlens=None, interpret=False):
  """q, k [B, T, H, K]; v [B, T, H, V]. Returns (o [B, T, H, V] in q.dtype, final_state f32)."""
  g = scalar_gate(None, retention_log_decay(q.shape[2]), q)
  return chunk_additive(q, k, v, g, scale=scale, initial_state=initial_state,
                        cu_seqlens=cu_seqlens, interpret=interpret)
