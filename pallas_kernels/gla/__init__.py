"""Gated linear attention (GLA; HGRN-2 runs on it): `chunk_gla`, `fused_recurrent_gla`.

The most general additive family: `pallas_kernels.gla.xla.chunk_gla` is the chunked core that simple
GLA (and through it retention and linear attention) and RWKV-6 reuse.
"""
from __future__ import annotations

from pallas_kernels.common import api
from pallas_kernels.gla.transition import TRANSITION
from pallas_kernels.simple_gla.transition import TRANSITION as NO_GATE_TRANSITION

_DOC = """Gated linear attention with a per-channel decay{kind} (fla's `{fla}_gla`).

  S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T;  o_t = S_t^T (scale q_t)

Args:
  q, k: [B, T, H, K]. v: [B, T, H, V].
  g (chunk_gla), gk (fused_recurrent_gla, None: no decay): [B, T, H, K] natural-log decays (<= 0;
    a positive value raises eagerly, is clamped to 0 under jit).
  gv (fused_recurrent_gla): None, or [B, T, H, V] natural-log decays per value channel,
    S_t = diag(exp(gk_t)) S_{t-1} diag(exp(gv_t)) + k_t v_t^T; only the float32 scan runs it ("xla",
    "reference"; "auto" takes it), and not with context_axis.
"""


def _run(kind, q, k, v, g, gv, scale, initial_state, output_final_state, reverse, state_v_first,
         cu_seqlens, backend, interpret, context_axis):
  d = api.dims(q, k, v, cu_seqlens, context_axis=context_axis)
  g = api.log_decay_gate("gk" if kind == "fused_recurrent" else "g", g, d, "[B, T, H, K]",
                         optional=kind == "fused_recurrent")
  gv = api.log_decay_gate("gv", gv, d, "[B, T, H, V]", optional=True)
  options = dict(scale=scale, initial_state=initial_state, output_final_state=output_final_state,
                 cu_seqlens=cu_seqlens, interpret=interpret, context_axis=context_axis,
                 reverse=reverse, state_v_first=state_v_first)
  if gv is not None:
    return api.run("gla", kind, d, (q, k, v, g), gv=gv,
                   backend=api.only_on_scan("gv", backend, context_axis), **options)
  if g is None:  # no decay at all: linear attention, on simple GLA's kernels
    return api.run("simple_gla", kind, d, (q, k, v, None, None), backend=backend,
                   transition=NO_GATE_TRANSITION, **options)
  return api.run("gla", kind, d, (q, k, v, g), backend=backend, transition=TRANSITION, **options)


def chunk_gla(q, k, v, g, scale=None, initial_state=None, output_final_state=False,
              state_v_first=False, cu_seqlens=None, cu_seqlens_cpu=None, *, backend="auto",
              interpret=False, context_axis=None):
  return _run("chunk", q, k, v, g, None, scale, initial_state, output_final_state, False,
              state_v_first, cu_seqlens, backend, interpret, context_axis)


def fused_recurrent_gla(q, k, v, gk=None, gv=None, scale=None, initial_state=None,
                        output_final_state=False, reverse=False, state_v_first=False, cu_seqlens=None,
                        *, backend="auto", interpret=False, context_axis=None, **kwargs):
  state_v_first, _ = api.fla_kwargs("fused_recurrent_gla", kwargs, state_v_first=state_v_first)
  return _run("fused_recurrent", q, k, v, gk, gv, scale, initial_state, output_final_state, reverse,
              state_v_first, cu_seqlens, backend, interpret, context_axis)


api.document(_DOC, chunk=chunk_gla, fused_recurrent=fused_recurrent_gla)
