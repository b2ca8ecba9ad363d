"""Linear attention on TPU: the additive-class Mosaic kernel (pallas_kernels/gla/tpu.py) with no
gate (decay 1); `normalize` is applied by the public op outside the kernel."""
from __future__ import annotations

from pallas_kernels.gla.tpu import chunk_additive


def chunk_linear_attn(q, k, v, *, scale, initial_state, cu_seqlens=None, interpret=False):
  """q, k [B, T, H, K]; v [B, T, H, V]. Returns (o [B, T, H, V] in q.dtype, final_state f32)."""
  return chunk_additive(q, k, v, None, scale=scale, initial_state=initial_state,
                        cu_seqlens=cu_seqlens, interpret=interpret)
