"""Kimi Delta Attention (KDA): `chunk_kda`, `fused_recurrent_kda`.

The gated delta rule with a per-channel decay; the backends reuse `pallas_kernels.gated_delta_rule`'s
code, validation and dispatch are `pallas_kernels.gated_delta_rule.run_delta_family`.
"""
from __future__ import annotations

from pallas_kernels.delta_rule import ARGS
from pallas_kernels.gated_delta_rule import run_delta_family

_DOC = """Kimi Delta Attention{kind_doc}.

  S_t = diag(exp(g_t)) S_{{t-1}};  S_t += k_t (beta_t (v_t - S_t^T k_t))^T;  o_t = S_t^T (scale q_t)

Mirrors fla.ops.kda.{name} with gates already in log space (fla's use_gate_in_kernel=False).

Args:
  q, k: [B, T, H, K]. v: [B, T, H, V].
  g: [B, T, H, K] per-channel natural-log decays (<= 0; a positive value raises eagerly, is clamped to
    0 under jit). Any magnitude is handled without overflow.
"""


def chunk_kda(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
              cu_seqlens=None, use_qk_l2norm_in_kernel=False, backend="auto", interpret=False):
  return run_delta_family("kda", "chunk", q, k, v, g, "[B, T, H, K]", beta, scale, initial_state,
                          output_final_state, cu_seqlens, use_qk_l2norm_in_kernel, backend, interpret)


def fused_recurrent_kda(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                        cu_seqlens=None, use_qk_l2norm_in_kernel=False, backend="auto", interpret=False):
  return run_delta_family("kda", "fused_recurrent", q, k, v, g, "[B, T, H, K]", beta, scale,
                          initial_state, output_final_state, cu_seqlens, use_qk_l2norm_in_kernel,
                          backend, interpret)


chunk_kda.__doc__ = _DOC.format(kind_doc=", chunked (training and prefill)", name="chunk_kda") + ARGS
fused_recurrent_kda.__doc__ = _DOC.format(kind_doc=", token by token (decode)",
                                          name="fused_recurrent_kda") + ARGS
