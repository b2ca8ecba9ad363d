"""Chunked linear attention in pure JAX: chunked simple GLA with no gate (decay 1)."""
from __future__ import annotations

from pallas_kernels.linear_attn.reference import fused_recurrent_linear_attn  # noqa: F401
from pallas_kernels.simple_gla.xla import chunk_simple_gla


def chunk_linear_attn(q, k, v, *, scale, initial_state, cu_seqlens=None):
  """q, k [B, T, H, K]; v [B, T, H, V]. Returns (o [B, T, H, V] in q.dtype, final_state f32)."""
  return chunk_simple_gla(q, k, v, None, None, scale=scale, initial_state=initial_state,
                          cu_seqlens=cu_seqlens)
