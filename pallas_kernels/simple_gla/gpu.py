"""Simple GLA on the gated delta rule's Pallas GPU kernels (Triton lowering) without the delta
correction: the chunk loop S = exp(G_C) S + (exp(G_C - G) k)^T v, o = scale exp(G) q S + P v."""
from __future__ import annotations

from pallas_kernels.common import gpu_recurrent
from pallas_kernels.gated_delta_rule import gpu as _gdn
from pallas_kernels.gla.reference import fused_recurrent_gla
from pallas_kernels.simple_gla.reference import scalar_gate

unsupported = _gdn.unsupported  # the dispatch `supports` hook: (q, k, v, ...) -> reason or None


def chunk_simple_gla(q, k, v, g=None, g_gamma=None, *, scale, initial_state=None, cu_seqlens=None,
                     interpret=False, config: _gdn.Config = _gdn.DEFAULT):
  """q, k [B, T, H, K]; v [B, T, H, V]; g None or [B, T, H]; g_gamma None or [H] (log decays).

  Returns (o [B, T, H, V] in q.dtype, final_state [N, H, K, V] float32).
  """
  return _gdn.run_chunk(q, k, v, scalar_gate(g, g_gamma, q), None, scale=scale,
                        initial_state=initial_state, cu_seqlens=cu_seqlens, interpret=interpret,
                        config=config)


def _reference(q, k, v, g, beta, *, scale, initial_state, cu_seqlens):
  del beta  # None: no delta correction
  return fused_recurrent_gla(q, k, v, g, scale=scale, initial_state=initial_state,
                             cu_seqlens=cu_seqlens)


def fused_recurrent_simple_gla(q, k, v, g=None, g_gamma=None, *, scale, initial_state=None,
                               cu_seqlens=None, interpret=False):
  """Token by token (decode): common/gpu_recurrent.py without the delta correction."""
  return gpu_recurrent.fused_recurrent(q, k, v, scalar_gate(g, g_gamma, q), None, scale=scale,
                                       initial_state=initial_state, cu_seqlens=cu_seqlens,
                                       interpret=interpret, reference=_reference)
