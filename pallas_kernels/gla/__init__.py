"""Gated linear attention (GLA; HGRN-2 runs on it): `chunk_gla`, `fused_recurrent_gla`.

The most general additive family: `pallas_kernels.gla.xla.chunk_gla` is the chunked core that simple
GLA (and through it retention and linear attention) and RWKV-6 reuse.
"""
from __future__ import annotations

from pallas_kernels.common import api
from pallas_kernels.gla.transition import TRANSITION

_DOC = """Gated linear attention with a per-channel decay{kind} (fla's `{fla}_gla`).

  S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T;  o_t = S_t^T (scale q_t)

Args:
  q, k: [B, T, H, K]. v: [B, T, H, V].
  g: [B, T, H, K] natural-log decays (<= 0; a positive value raises eagerly, is clamped to 0 under jit).
"""


def _run(kind, q, k, v, g, scale, initial_state, output_final_state, cu_seqlens, backend,
         interpret, context_axis):
  d = api.dims(q, k, v, cu_seqlens, context_axis=context_axis)
  g = api.log_decay_gate("g", g, d, "[B, T, H, K]")
  return api.run("gla", kind, d, (q, k, v, g), scale=scale, initial_state=initial_state,
                 output_final_state=output_final_state, cu_seqlens=cu_seqlens, backend=backend,
                 interpret=interpret, context_axis=context_axis,
                 transition=TRANSITION)


def chunk_gla(q, k, v, g, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None,
              *, backend="auto", interpret=False, context_axis=None):
  return _run("chunk", q, k, v, g, scale, initial_state, output_final_state, cu_seqlens, backend,
              interpret, context_axis)


def fused_recurrent_gla(q, k, v, g, scale=None, initial_state=None, output_final_state=False,
                        cu_seqlens=None, *, backend="auto", interpret=False, context_axis=None):
  return _run("fused_recurrent", q, k, v, g, scale, initial_state, output_final_state, cu_seqlens,
              backend, interpret, context_axis)


api.document(_DOC, chunk=chunk_gla, fused_recurrent=fused_recurrent_gla)
