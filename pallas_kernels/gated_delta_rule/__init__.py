"""Gated delta rule (Gated DeltaNet): `chunk_gated_delta_rule`, `fused_recurrent_gated_delta_rule`."""
from __future__ import annotations

from pallas_kernels.common import checks, dispatch
from pallas_kernels.common.chunk import l2norm

_DOC = """Gated delta rule{kind_doc}.

  S_t = exp(g_t) S_{{t-1}};  S_t += k_t (beta_t (v_t - S_t^T k_t))^T;  o_t = S_t^T (scale q_t)

Args:
  q, k: [B, T, H, K]. v: [B, T, H, V].
  g: [B, T, H] natural-log decays (<= 0; a positive value raises eagerly, is clamped to 0 under jit).
  beta: [B, T, H] write strengths (usually sigmoid outputs).
  scale: query scale, default K ** -0.5.
  initial_state: [N, H, K, V] (N = B, or the number of sequences with cu_seqlens).
  output_final_state: return the float32 final state [N, H, K, V] instead of None.
  cu_seqlens: int32 [N + 1] offsets of packed sequences (B == 1); the state resets at each boundary.
  use_qk_l2norm_in_kernel: L2-normalise q and k over K first (as Gated DeltaNet layers do).
  backend: "auto" | "reference" | "xla" | "gpu" | "tpu".  interpret: run a Pallas kernel interpreted.
Returns:
  (o [B, T, H, V] in q.dtype, final_state or None).
"""


def _run(kind, q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens,
         use_qk_l2norm_in_kernel, backend, interpret):
  B, T, H, K, V = checks.check_qkv(q, k, v)
  checks.check_shape("g", g, (B, T, H), "[B, T, H]")
  checks.check_shape("beta", beta, (B, T, H), "[B, T, H]")
  N = checks.num_sequences(B, T, cu_seqlens)
  checks.check_state("initial_state", initial_state, (N, H, K, V), "[N, H, K, V]")
  g = checks.log_decay("g", g)
  if use_qk_l2norm_in_kernel:
    q, k = l2norm(q), l2norm(k)
  fn = dispatch.resolve("gated_delta_rule", kind, backend, interpret,
                        supports=lambda mod: getattr(mod, "unsupported", lambda *a: None)(q, k, v, g))
  o, S = fn(q, k, v, g, beta, scale=K ** -0.5 if scale is None else scale,
            initial_state=initial_state, cu_seqlens=cu_seqlens)
  return o, S if output_final_state else None


def chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                           cu_seqlens=None, use_qk_l2norm_in_kernel=False, backend="auto",
                           interpret=False):
  return _run("chunk", q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens,
              use_qk_l2norm_in_kernel, backend, interpret)


def fused_recurrent_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None,
                                     output_final_state=False, cu_seqlens=None,
                                     use_qk_l2norm_in_kernel=False, backend="auto", interpret=False):
  return _run("fused_recurrent", q, k, v, g, beta, scale, initial_state, output_final_state,
              cu_seqlens, use_qk_l2norm_in_kernel, backend, interpret)


chunk_gated_delta_rule.__doc__ = _DOC.format(kind_doc=", chunked (training and prefill)")
fused_recurrent_gated_delta_rule.__doc__ = _DOC.format(kind_doc=", token by token (decode)")
