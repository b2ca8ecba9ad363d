"""Chunked delta rule in pure JAX: the gated delta rule's WY/UT chunked path with no gate."""
from __future__ import annotations

from pallas_kernels.delta_rule.reference import fused_recurrent_delta_rule  # noqa: F401
from pallas_kernels.gated_delta_rule import xla as gdn


def chunk_delta_rule(q, k, v, beta, *, scale, initial_state, cu_seqlens=None,
                     chunk_size: int = gdn.CHUNK):
  """q, k [B, T, H, K]; v [B, T, H, V]; beta [B, T, H].

  Returns (o [B, T, H, V] in q.dtype, final_state [N, H, K, V] float32).
  """
  return gdn.chunk_gated_delta_rule(q, k, v, None, beta, scale=scale, initial_state=initial_state,
                                    cu_seqlens=cu_seqlens, chunk_size=chunk_size)
