"""Delta rule (DeltaNet): `chunk_delta_rule`, `fused_recurrent_delta_rule`. The gated delta rule
with g = 0: its backends are adapters onto `pallas_kernels.gated_delta_rule`'s."""
from __future__ import annotations

import jax.numpy as jnp

from pallas_kernels.common import api
from pallas_kernels.common.chunk import l2norm
from pallas_kernels.delta_rule.transition import TRANSITION

_DOC = """Delta rule{kind} (fla's `{fla}_delta_rule`).

  S_t = S_{t-1} + k_t (beta_t (v_t - S_{t-1}^T k_t))^T;  o_t = S_t^T (scale q_t)

Args:
  q, k: [B, T, H, K]. v: [B, T, H, V].
  beta: [B, T, H] write strengths (usually sigmoid outputs); fused_recurrent_delta_rule's default
    is ones, as fla's.
  use_qk_l2norm_in_kernel: L2-normalise q and k over K first (as the layers do); without it keep
    ||k|| <= 1 for a stable recurrence.
"""


def _run(kind, q, k, v, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
         cu_seqlens, backend, interpret, context_axis):
  d = api.dims(q, k, v, cu_seqlens, context_axis=context_axis)
  if beta is None and kind == "fused_recurrent":  # fla's default there; the chunk op needs beta
    beta = jnp.ones(q.shape[:3], api.F32)
  beta = api.gate("beta", beta, d, "[B, T, H]")
  if use_qk_l2norm_in_kernel:
    q, k = l2norm(q), l2norm(k)
  return api.run("delta_rule", kind, d, (q, k, v, beta), scale=scale, initial_state=initial_state,
                 output_final_state=output_final_state, cu_seqlens=cu_seqlens, backend=backend,
                 interpret=interpret, context_axis=context_axis,
                 transition=TRANSITION)


def chunk_delta_rule(q, k, v, beta, scale=None, initial_state=None, output_final_state=False,
                     use_qk_l2norm_in_kernel=False, cu_seqlens=None, cu_seqlens_cpu=None, *,
                     backend="auto", interpret=False, context_axis=None, **kwargs):
  api.fla_kwargs("chunk_delta_rule", kwargs)
  return _run("chunk", q, k, v, beta, scale, initial_state, output_final_state,
              use_qk_l2norm_in_kernel, cu_seqlens, backend, interpret, context_axis)


def fused_recurrent_delta_rule(q, k, v, beta=None, scale=None, initial_state=None,
                               output_final_state=False, use_qk_l2norm_in_kernel=False,
                               cu_seqlens=None, *, backend="auto", interpret=False,
                               context_axis=None):
  return _run("fused_recurrent", q, k, v, beta, scale, initial_state, output_final_state,
              use_qk_l2norm_in_kernel, cu_seqlens, backend, interpret, context_axis)


api.document(_DOC, chunk=chunk_delta_rule, fused_recurrent=fused_recurrent_delta_rule)
