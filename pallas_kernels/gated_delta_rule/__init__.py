"""Gated delta rule (Gated DeltaNet): `chunk_gated_delta_rule`, `fused_recurrent_gated_delta_rule`."""
from __future__ import annotations

from pallas_kernels.common import api
from pallas_kernels.common.chunk import l2norm
from pallas_kernels.gated_delta_rule.transition import TRANSITION

_DOC = """Gated delta rule{kind} (fla's `{fla}_gated_delta_rule`).

  S_t = exp(g_t) S_{t-1};  S_t += k_t (beta_t (v_t - S_t^T k_t))^T;  o_t = S_t^T (scale q_t)

Args:
  q, k: [B, T, H, K]. v: [B, T, H, V].
  g: [B, T, H] natural-log decays (<= 0; a positive value raises eagerly, is clamped to 0 under jit).
  beta: [B, T, H] write strengths (usually sigmoid outputs).
  use_qk_l2norm_in_kernel: L2-normalise q and k over K first (as Gated DeltaNet layers do).
"""


def _run(kind, q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens,
         use_qk_l2norm_in_kernel, backend, interpret, context_axis):
  d = api.dims(q, k, v, cu_seqlens, context_axis=context_axis)
  g = api.log_decay_gate("g", g, d, "[B, T, H]")
  beta = api.gate("beta", beta, d, "[B, T, H]")
  if use_qk_l2norm_in_kernel:
    q, k = l2norm(q), l2norm(k)
  return api.run("gated_delta_rule", kind, d, (q, k, v, g, beta), scale=scale,
                 initial_state=initial_state, output_final_state=output_final_state,
                 cu_seqlens=cu_seqlens, backend=backend, interpret=interpret, context_axis=context_axis,
                 transition=TRANSITION)


def chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                           cu_seqlens=None, use_qk_l2norm_in_kernel=False, *, backend="auto",
                           interpret=False, context_axis=None):
  return _run("chunk", q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens,
              use_qk_l2norm_in_kernel, backend, interpret, context_axis)


def fused_recurrent_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None,
                                     output_final_state=False, cu_seqlens=None,
                                     use_qk_l2norm_in_kernel=False, *, backend="auto",
                                     interpret=False, context_axis=None):
  return _run("fused_recurrent", q, k, v, g, beta, scale, initial_state, output_final_state,
              cu_seqlens, use_qk_l2norm_in_kernel, backend, interpret, context_axis)


api.document(_DOC, chunk=chunk_gated_delta_rule, fused_recurrent=fused_recurrent_gated_delta_rule)
