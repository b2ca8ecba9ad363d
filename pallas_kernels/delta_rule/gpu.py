"""Delta rule on the gated delta rule's Pallas GPU kernels (Triton lowering) with no gate."""
from __future__ import annotations

from pallas_kernels.common.gpu.config import DEFAULT, Config
from pallas_kernels.gated_delta_rule import gpu as gated_delta_rule_gpu

unsupported = gated_delta_rule_gpu.unsupported  # the dispatch `supports` hook: reason or None


def chunk_delta_rule(q, k, v, beta, *, scale, initial_state, cu_seqlens=None, interpret=False,
                     config: Config = DEFAULT):
  """q, k [B, T, H, K]; v [B, T, H, V]; beta [B, T, H].

  Returns (o [B, T, H, V] in q.dtype, final_state [N, H, K, V] float32).
  """
  return gated_delta_rule_gpu.chunk_gated_delta_rule(
      q, k, v, None, beta, scale=scale, initial_state=initial_state, cu_seqlens=cu_seqlens,
      interpret=interpret, config=config)


def fused_recurrent_delta_rule(q, k, v, beta, *, scale, initial_state, cu_seqlens=None,
                               interpret=False):
  """Token by token (decode), on the gated delta rule's recurrent kernel with g = 0."""
  return gated_delta_rule_gpu.fused_recurrent_gated_delta_rule(
      q, k, v, None, beta, scale=scale, initial_state=initial_state, cu_seqlens=cu_seqlens,
      interpret=interpret)
