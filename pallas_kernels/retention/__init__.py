"""Retention (RetNet's multi-scale retention): `chunk_retention`, `fused_recurrent_retention`.
Simple GLA with the fixed per-head decay gamma_h = 1 - 2 ** (-5 - h)."""
from __future__ import annotations

from pallas_kernels.common import api
from pallas_kernels.retention.reference import retention_log_decay  # noqa: F401  (public: g_gamma of retention)
from pallas_kernels.retention.transition import TRANSITION

_DOC = """Retention: linear attention with a fixed per-head decay{kind} (fla's `{fla}_retention`).

  S_t = gamma_h S_{t-1} + k_t v_t^T;  o_t = S_t^T (scale q_t);  gamma_h = 1 - 2 ** (-5 - h)

Args:
  q, k: [B, T, H, K]. v: [B, T, H, V].
"""


def _run(kind, q, k, v, scale, initial_state, output_final_state, reverse, state_v_first, cu_seqlens,
         backend, interpret, context_axis):
  d = api.dims(q, k, v, cu_seqlens, context_axis=context_axis)
  return api.run("retention", kind, d, (q, k, v), scale=scale, initial_state=initial_state,
                 output_final_state=output_final_state, cu_seqlens=cu_seqlens, backend=backend,
                 interpret=interpret, context_axis=context_axis, reverse=reverse,
                 state_v_first=state_v_first, transition=TRANSITION)


def chunk_retention(q, k, v, scale=None, initial_state=None, output_final_state=False,
                    cu_seqlens=None, *, backend="auto", interpret=False, context_axis=None, **kwargs):
  api.fla_kwargs("chunk_retention", kwargs)
  return _run("chunk", q, k, v, scale, initial_state, output_final_state, False, False, cu_seqlens,
              backend, interpret, context_axis)


def fused_recurrent_retention(q, k, v, scale=None, initial_state=None, output_final_state=False,
                              reverse=False, state_v_first=False, cu_seqlens=None, *, backend="auto",
                              interpret=False, context_axis=None, **kwargs):
  state_v_first, _ = api.fla_kwargs("fused_recurrent_retention", kwargs, state_v_first=state_v_first)
  return _run("fused_recurrent", q, k, v, scale, initial_state, output_final_state, reverse,
              state_v_first, cu_seqlens, backend, interpret, context_axis)


api.document(_DOC, chunk=chunk_retention, fused_recurrent=fused_recurrent_retention)
