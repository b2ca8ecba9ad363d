"""Retention on GPU: the simple-GLA Pallas GPU kernels (Triton lowering) with
g_gamma = log(1 - 2 ** (-5 - h))."""
from __future__ import annotations

from pallas_kernels.common.gpu.config import DEFAULT, Config
from pallas_kernels.retention.reference import retention_log_decay
from pallas_kernels.simple_gla import gpu as simple_gla_gpu

unsupported = simple_gla_gpu.unsupported  # the dispatch `supports` hook: reason or None


def chunk_retention(q, k, v, *, scale, initial_state, cu_seqlens=None, interpret=False,
                    config: Config = DEFAULT):
  """q, k [B, T, H, K]; v [B, T, H, V]. Returns (o [B, T, H, V] in q.dtype, final_state f32)."""
  return simple_gla_gpu.chunk_simple_gla(q, k, v, None, retention_log_decay(q.shape[2]),
                                         scale=scale, initial_state=initial_state,
                                         cu_seqlens=cu_seqlens, interpret=interpret, config=config)


def fused_recurrent_retention(q, k, v, *, scale, initial_state, cu_seqlens=None,
                              interpret=False):
  """Token by token (decode): simple GLA's recurrent kernel with the fixed per-head decay."""
  return simple_gla_gpu.fused_recurrent_simple_gla(q, k, v, None, retention_log_decay(q.shape[2]),
                                                   scale=scale, initial_state=initial_state,
                                                   cu_seqlens=cu_seqlens, interpret=interpret)
