"""GLA on TPU: the additive-class Mosaic kernel (pallas_kernels/common/tpu_additive.py) with a
per-channel gate g [B, T, H, K] (a scalar [B, T, H] gate also works). `interpret=True` runs it in TPU
interpret mode on any host."""
from __future__ import annotations

from pallas_kernels.common.tpu_additive import chunk_additive


def chunk_gla(q, k, v, g, *, scale, initial_state=None, cu_seqlens=None, interpret=False):
  """q, k [B, T, H, K]; v [B, T, H, V]; g [B, T, H, K] log decays.

  Returns (o [B, T, H, V] in q.dtype, final_state [N, H, K, V] float32), exactly like xla.py.
  """
  return chunk_additive(q, k, v, g, scale=scale, initial_state=initial_state,
                        cu_seqlens=cu_seqlens, interpret=interpret)
