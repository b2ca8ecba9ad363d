"""Chunked RWKV-6 in pure JAX: the GLA core with `u`, i.e. a strict intra-chunk mask, the query side
decayed by the exclusive cumsum (o_t reads S_{t-1}) and the diagonal bonus u."""
from __future__ import annotations

from pallas_kernels.gla.xla import chunk_gla
from pallas_kernels.rwkv6.reference import fused_recurrent_rwkv6  # noqa: F401


def chunk_rwkv6(r, k, v, w, u, *, scale, initial_state, cu_seqlens=None):
  """r, k [B, T, H, K]; v [B, T, H, V]; w [B, T, H, K] log decays; u [H, K] bonus.

  Returns (o [B, T, H, V] in r.dtype, final_state [N, H, K, V] float32).
  """
  return chunk_gla(r, k, v, w, scale=scale, initial_state=initial_state, cu_seqlens=cu_seqlens, u=u)
