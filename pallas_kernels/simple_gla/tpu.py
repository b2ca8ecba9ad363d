"""Simple GLA on TPU: the additive-class Mosaic kernel (pallas_kernels/gla/tpu.py) with a scalar
gate per head and step, whose intra-chunk decay factors out of the score matmul. `interpret=True`
runs it in TPU interpret mode on any host."""
from __future__ import annotations

from pallas_kernels.gla.tpu import chunk_additive
from pallas_kernels.simple_gla.reference import scalar_gate


def chunk_simple_gla(q, k, v, g=None, g_gamma=None, *, scale, initial_state, cu_seqlens=None,
                     interpret=False):
  """q, k [B, T, H, K]; v [B, T, H, V]; g None or [B, T, H]; g_gamma None or [H].

  Returns (o [B, T, H, V] in q.dtype, final_state [N, H, K, V] float32), exactly like xla.py.
  """
  return chunk_additive(q, k, v, scalar_gate(g, g_gamma, q), scale=scale,
                        initial_state=initial_state, cu_seqlens=cu_seqlens, interpret=interpret)
