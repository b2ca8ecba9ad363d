"""RWKV-6 on TPU: the additive-class Mosaic kernel (pallas_kernels/gla/tpu.py) with the bonus u:
strict intra-chunk mask, the query side decayed by the exclusive cumsum (o_t reads S_{t-1}) and the
diagonal term. `interpret=True` runs it in TPU interpret mode on any host."""
from __future__ import annotations

from pallas_kernels.gla.tpu import chunk_additive


def chunk_rwkv6(r, k, v, w, u, *, scale, initial_state, cu_seqlens=None, interpret=False):
  """r, k [B, T, H, K]; v [B, T, H, V]; w [B, T, H, K] log decays; u [H, K] bonus.

  Returns (o [B, T, H, V] in r.dtype, final_state [N, H, K, V] float32), exactly like xla.py.
  """
  return chunk_additive(r, k, v, w, scale=scale, initial_state=initial_state,
                        cu_seqlens=cu_seqlens, u=u, interpret=interpret)
