"""Chunked simple GLA in pure JAX: the GLA core (`pallas_kernels.gla.xla`) with a scalar gate, whose
intra-chunk decay factors out of the score matmul."""
from __future__ import annotations

from pallas_kernels.gla.xla import chunk_gla
from pallas_kernels.simple_gla.reference import fused_recurrent_simple_gla, scalar_gate  # noqa: F401


def chunk_simple_gla(q, k, v, g=None, g_gamma=None, *, scale, initial_state, cu_seqlens=None):
  """q, k [B, T, H, K]; v [B, T, H, V]; g None or [B, T, H]; g_gamma None or [H].

  Returns (o [B, T, H, V] in q.dtype, final_state [N, H, K, V] float32).
  """
  return chunk_gla(q, k, v, scalar_gate(g, g_gamma, q), scale=scale, initial_state=initial_state,
                   cu_seqlens=cu_seqlens)
