"""Delta rule on the gated delta rule's Pallas GPU kernels (Triton lowering) with no gate."""
from __future__ import annotations

from pallas_kernels.gated_delta_rule import gpu as _gdn

unsupported = _gdn.unsupported  # the dispatch `supports` hook: (q, k, v, g=None) -> reason or None


def chunk_delta_rule(q, k, v, beta, *, scale, initial_state=None, cu_seqlens=None, interpret=False,
                     config: _gdn.Config = _gdn.DEFAULT):
  """q, k [B, T, H, K]; v [B, T, H, V]; beta [B, T, H].

  Returns (o [B, T, H, V] in q.dtype, final_state [N, H, K, V] float32).
  """
  return _gdn.chunk_gated_delta_rule(q, k, v, None, beta, scale=scale, initial_state=initial_state,
                                     cu_seqlens=cu_seqlens, interpret=interpret, config=config)


def fused_recurrent_delta_rule(q, k, v, beta, *, scale, initial_state=None, cu_seqlens=None,
                               interpret=False):
  """Token by token (decode), on the gated delta rule's recurrent kernel with g = 0."""
  return _gdn.fused_recurrent_gated_delta_rule(q, k, v, None, beta, scale=scale,
                                               initial_state=initial_state, cu_seqlens=cu_seqlens,
                                               interpret=interpret)
