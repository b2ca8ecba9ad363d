"""Delta rule on TPU: the delta-rule-class Mosaic kernel (pallas_kernels/gated_delta_rule/tpu.py)
with no gate. `interpret=True` runs it in TPU interpret mode on any host."""
from __future__ import annotations

from pallas_kernels.gated_delta_rule.tpu import chunk_delta


def chunk_delta_rule(q, k, v, beta, *, scale, initial_state, cu_seqlens=None, interpret=False):
  """q, k [B, T, H, K]; v [B, T, H, V]; beta [B, T, H].

  Returns (o [B, T, H, V] in q.dtype, final_state [N, H, K, V] float32), exactly like xla.py.
  """
  return chunk_delta(q, k, v, None, beta, scale=scale, initial_state=initial_state,
                     cu_seqlens=cu_seqlens, interpret=interpret)
