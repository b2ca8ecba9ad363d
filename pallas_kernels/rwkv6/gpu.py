"""RWKV-6 on the GLA Pallas GPU kernels (Triton lowering, `pallas_kernels/gla/gpu.py`): the same
state and dh passes; the chunk kernels in their exclusive mode, where o_t reads S_{t-1} (queries
decayed by the exclusive cumsum G - w, strict intra-chunk mask) and the bonus scale r_i . (u k_i) is
the diagonal of the intra-chunk scores, so dv, dr and dk get its terms with no extra pass; du is
summed per chunk in the dq/dk/dg kernel."""
from __future__ import annotations

from pallas_kernels.gla import gpu as _gla

unsupported = _gla.unsupported  # the dispatch `supports` hook: (r, k, v, w, u) -> reason or None


def chunk_rwkv6(r, k, v, w, u, *, scale, initial_state, cu_seqlens=None, interpret=False,
                config: _gla.Config = _gla.DEFAULT):
  """r, k [B, T, H, K]; v [B, T, H, V]; w [B, T, H, K] log decays; u [H, K] bonus.

  Returns (o [B, T, H, V] in r.dtype, final_state [N, H, K, V] float32).
  """
  return _gla.run_chunk(r, k, v, w, u, scale=scale, initial_state=initial_state,
                        cu_seqlens=cu_seqlens, interpret=interpret, config=config)


def fused_recurrent_rwkv6(r, k, v, w, u, *, scale, initial_state, cu_seqlens=None,
                          interpret=False):
  """Token by token (decode): the GLA kernel reading S_{t-1} + diag(u) k_t v_t^T."""
  return _gla.recurrent(r, k, v, w, u, scale=scale, initial_state=initial_state,
                        cu_seqlens=cu_seqlens, interpret=interpret)
