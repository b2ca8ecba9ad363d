"""Gated delta rule on TPU: the delta-rule-class Mosaic kernel (pallas_kernels/common/tpu_delta.py)
with a scalar gate per head and step. `interpret=True` runs it in TPU interpret mode on any host."""
from __future__ import annotations

from pallas_kernels.common.tpu_delta import chunk_delta


def chunk_gated_delta_rule(q, k, v, g, beta, *, scale, initial_state=None, cu_seqlens=None,
                           interpret=False):
  """q, k [B, T, H, K]; v [B, T, H, V]; g, beta [B, T, H] (g may also be [B, T, H, K]).

  Returns (o [B, T, H, V] in q.dtype, final_state [N, H, K, V] float32), exactly like xla.py.
  """
  return chunk_delta(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                     cu_seqlens=cu_seqlens, interpret=interpret)
