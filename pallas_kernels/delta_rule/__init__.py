"""Delta rule (DeltaNet): `chunk_delta_rule`, `fused_recurrent_delta_rule`.

The gated delta rule with g = 0; the backends reuse `pallas_kernels.gated_delta_rule`'s code.
`run_delta_rule` (validation and dispatch) is shared with KDA (`pallas_kernels.kda`).
"""
from __future__ import annotations

from pallas_kernels.common import checks, dispatch
from pallas_kernels.common.chunk import l2norm

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


def run_delta_rule(family, kind, q, k, v, g, beta, scale, initial_state, output_final_state,
                   cu_seqlens, use_qk_l2norm_in_kernel, backend, interpret):
  """Validates and dispatches a delta-rule op without a gate (g None) or with a per-channel gate
  (g [B, T, H, K] log decays, KDA). The backend function gets (q, k, v, [g,] beta)."""
  B, T, H, K, V = checks.check_qkv(q, k, v)
  if g is not None:
    checks.check_rank("g", g, 4, "[B, T, H, K]")
    checks.check_shape("g", g, (B, T, H, K), "[B, T, H, K]")
  checks.check_rank("beta", beta, 3, "[B, T, H]")
  checks.check_shape("beta", beta, (B, T, H), "[B, T, H]")
  N = checks.num_sequences(B, T, cu_seqlens)
  checks.check_state("initial_state", initial_state, (N, H, K, V), "[N, H, K, V]")
  if use_qk_l2norm_in_kernel:
    q, k = l2norm(q), l2norm(k)
  gates = (beta,) if g is None else (checks.log_decay("g", g), beta)
  fn = dispatch.resolve(family, kind, backend, interpret)
  o, S = fn(q, k, v, *gates, scale=K ** -0.5 if scale is None else scale,
            initial_state=initial_state, cu_seqlens=cu_seqlens)
  return o, S if output_final_state else None


def chunk_delta_rule(q, k, v, beta, scale=None, initial_state=None, output_final_state=False,
                     cu_seqlens=None, use_qk_l2norm_in_kernel=False, backend="auto", interpret=False):
  return run_delta_rule("delta_rule", "chunk", q, k, v, None, beta, scale, initial_state,
                        output_final_state, cu_seqlens, use_qk_l2norm_in_kernel, backend, interpret)


def fused_recurrent_delta_rule(q, k, v, beta, scale=None, initial_state=None, output_final_state=False,
                               cu_seqlens=None, use_qk_l2norm_in_kernel=False, backend="auto",
                               interpret=False):
  return run_delta_rule("delta_rule", "fused_recurrent", q, k, v, None, beta, scale, initial_state,
                        output_final_state, cu_seqlens, use_qk_l2norm_in_kernel, backend, interpret)


chunk_delta_rule.__doc__ = _DOC.format(kind_doc=", chunked (training and prefill)",
                                       name="chunk_delta_rule") + ARGS
fused_recurrent_delta_rule.__doc__ = _DOC.format(kind_doc=", token by token (decode)",
                                                 name="fused_recurrent_delta_rule") + ARGS
