"""Gated delta rule (Gated DeltaNet): `chunk_gated_delta_rule`, `fused_recurrent_gated_delta_rule`."""
from __future__ import annotations

from pallas_kernels.common import api
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


def run_delta_family(family, kind, q, k, v, g, g_layout, beta, scale, initial_state,
                     output_final_state, cu_seqlens, use_qk_l2norm_in_kernel, backend, interpret):
  """The front door of the delta-rule ops (gated delta rule, delta rule, KDA): checks, optional q/k
  L2 norm, dispatch. `g_layout` is None (no gate), "[B, T, H]" or "[B, T, H, K]"; the backend gets
  (q, k, v, [g,] beta)."""
  d = api.dims(q, k, v, cu_seqlens)
  gates = () if g_layout is None else (api.log_decay_gate("g", g, d, g_layout),)
  beta = api.gate("beta", beta, d, "[B, T, H]")
  if use_qk_l2norm_in_kernel:
    q, k = l2norm(q), l2norm(k)
  return api.run(family, kind, d, (q, k, v, *gates, beta), scale=scale, initial_state=initial_state,
                 output_final_state=output_final_state, cu_seqlens=cu_seqlens, backend=backend,
                 interpret=interpret)


def _run(kind, *args):
  return run_delta_family("gated_delta_rule", kind, *args[:4], "[B, T, H]", *args[4:])


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
