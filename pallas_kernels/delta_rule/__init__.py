"""Delta rule (DeltaNet): `chunk_delta_rule`, `fused_recurrent_delta_rule`.

The gated delta rule with g = 0; the backends reuse `pallas_kernels.gated_delta_rule`'s code.
Validation and dispatch: `pallas_kernels.gated_delta_rule.run_delta_family`.
"""
from __future__ import annotations

from pallas_kernels.gated_delta_rule import run_delta_family

ARGS = """  beta: [B, T, H] write strengths (usually sigmoid outputs).
  scale: query scale, default K ** -0.5.
  initial_state: [N, H, K, V] (N = B, or the number of sequences with cu_seqlens).
  output_final_state: return the float32 final state [N, H, K, V] instead of None.
  cu_seqlens: int32 [N + 1] offsets of packed sequences (B == 1); the state resets at each boundary.
  use_qk_l2norm_in_kernel: L2-normalise q and k over K first (as the layers do); without it keep
    ||k|| <= 1 for a stable recurrence.
  backend: "auto" | "reference" | "xla" | "gpu" | "tpu".  interpret: run a Pallas kernel interpreted.
Returns:
  (o [B, T, H, V] in q.dtype, final_state [N, H, K, V] float32 or None).
"""  # the arguments after q, k, v (and g), shared with KDA's docstrings

_DOC = """Delta rule{kind_doc}.

  S_t = S_{{t-1}} + k_t (beta_t (v_t - S_{{t-1}}^T k_t))^T;  o_t = S_t^T (scale q_t)

Mirrors fla.ops.delta_rule.{name}.

Args:
  q, k: [B, T, H, K]. v: [B, T, H, V].
"""


def chunk_delta_rule(q, k, v, beta, scale=None, initial_state=None, output_final_state=False,
                     cu_seqlens=None, use_qk_l2norm_in_kernel=False, backend="auto", interpret=False):
  return run_delta_family("delta_rule", "chunk", q, k, v, None, None, beta, scale, initial_state,
                          output_final_state, cu_seqlens, use_qk_l2norm_in_kernel, backend, interpret)


def fused_recurrent_delta_rule(q, k, v, beta, scale=None, initial_state=None, output_final_state=False,
                               cu_seqlens=None, use_qk_l2norm_in_kernel=False, backend="auto",
                               interpret=False):
  return run_delta_family("delta_rule", "fused_recurrent", q, k, v, None, None, beta, scale,
                          initial_state, output_final_state, cu_seqlens, use_qk_l2norm_in_kernel,
                          backend, interpret)


chunk_delta_rule.__doc__ = _DOC.format(kind_doc=", chunked (training and prefill)",
                                       name="chunk_delta_rule") + ARGS
fused_recurrent_delta_rule.__doc__ = _DOC.format(kind_doc=", token by token (decode)",
                                                 name="fused_recurrent_delta_rule") + ARGS
