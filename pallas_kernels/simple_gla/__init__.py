"""Simple GLA (scalar decay per head and step: Mamba-2 SSD, Lightning, gated RetNet):
`chunk_simple_gla`, `fused_recurrent_simple_gla`. Retention and linear attention route through it."""
from __future__ import annotations

from pallas_kernels.common import api
from pallas_kernels.simple_gla.transition import TRANSITION

_DOC = """Simple gated linear attention, one scalar decay per head and step{kind} (fla's `{fla}_simple_gla`).

  S_t = exp(g_t + g_gamma) S_{t-1} + k_t v_t^T;  o_t = S_t^T (scale q_t)

Args:
  q, k: [B, T, H, K]. v: [B, T, H, V].
  g: None or [B, T, H] natural-log decays per step.  g_gamma: None or [H] constant log decays per head.
    Either, both (they add up) or neither (plain linear attention). Both must be <= 0 (a positive
    value raises eagerly, is clamped to 0 under jit).
"""


def _run(kind, q, k, v, g, g_gamma, scale, initial_state, output_final_state, reverse, state_v_first,
         cu_seqlens, backend, interpret, context_axis):
  d = api.dims(q, k, v, cu_seqlens, context_axis=context_axis)
  g = api.log_decay_gate("g", g, d, "[B, T, H]", optional=True)
  g_gamma = api.log_decay_gate("g_gamma", g_gamma, d, "[H]", optional=True)
  return api.run("simple_gla", kind, d, (q, k, v, g, g_gamma), scale=scale,
                 initial_state=initial_state, output_final_state=output_final_state,
                 cu_seqlens=cu_seqlens, backend=backend, interpret=interpret, context_axis=context_axis,
                 reverse=reverse, state_v_first=state_v_first, transition=TRANSITION)


def chunk_simple_gla(q, k, v, g=None, g_gamma=None, scale=None, initial_state=None,
                     output_final_state=False, state_v_first=False, cu_seqlens=None,
                     cu_seqlens_cpu=None, *, backend="auto", interpret=False, context_axis=None,
                     **kwargs):
  api.fla_kwargs("chunk_simple_gla", kwargs)
  return _run("chunk", q, k, v, g, g_gamma, scale, initial_state, output_final_state, False,
              state_v_first, cu_seqlens, backend, interpret, context_axis)


def fused_recurrent_simple_gla(q, k, v, g=None, g_gamma=None, scale=None, initial_state=None,
                               output_final_state=False, reverse=False, state_v_first=False,
                               cu_seqlens=None, *, backend="auto", interpret=False,
                               context_axis=None, **kwargs):
  state_v_first, _ = api.fla_kwargs("fused_recurrent_simple_gla", kwargs, state_v_first=state_v_first)
  return _run("fused_recurrent", q, k, v, g, g_gamma, scale, initial_state, output_final_state,
              reverse, state_v_first, cu_seqlens, backend, interpret, context_axis)


api.document(_DOC, chunk=chunk_simple_gla, fused_recurrent=fused_recurrent_simple_gla)
