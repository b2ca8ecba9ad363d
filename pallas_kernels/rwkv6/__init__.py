"""RWKV-6 (Finch) time mixing: `chunk_rwkv6`, `fused_recurrent_rwkv6`. Runs on the GLA core."""
from __future__ import annotations

from pallas_kernels.common import api
from pallas_kernels.rwkv6.transition import TRANSITION

_DOC = """RWKV-6 time mixing: data-dependent per-channel decay and a bonus for the current token{kind}
(fla's `{fla}_rwkv6`).

  o_t = (S_{t-1} + diag(u) k_t v_t^T)^T (scale r_t);  S_t = diag(exp(w_t)) S_{t-1} + k_t v_t^T

Args:
  r (receptance, the query), k: [B, T, H, K]. v: [B, T, H, V].
  w: [B, T, H, K] natural-log decays (RWKV-6 layers pass -exp(w_raw); <= 0: a positive value raises
    eagerly, is clamped to 0 under jit).
  u: [H, K] bonus ("time_first") of the current token.
"""


def _run(kind, r, k, v, w, u, scale, initial_state, output_final_state, reverse, cu_seqlens, backend,
         interpret, context_axis):
  d = api.dims(r, k, v, cu_seqlens, q_name="r", context_axis=context_axis)
  w = api.log_decay_gate("w", w, d, "[B, T, H, K]")
  u = api.gate("u", u, d, "[H, K]")
  return api.run("rwkv6", kind, d, (r, k, v, w, u), scale=scale, initial_state=initial_state,
                 output_final_state=output_final_state, cu_seqlens=cu_seqlens, backend=backend,
                 interpret=interpret, context_axis=context_axis, reverse=reverse,
                 transition=TRANSITION)


def chunk_rwkv6(r, k, v, w, u, scale=None, initial_state=None, output_final_state=False,
                cu_seqlens=None, cu_seqlens_cpu=None, *, backend="auto", interpret=False,
                context_axis=None, **kwargs):
  api.fla_kwargs("chunk_rwkv6", kwargs)
  return _run("chunk", r, k, v, w, u, scale, initial_state, output_final_state, False, cu_seqlens,
              backend, interpret, context_axis)


def fused_recurrent_rwkv6(r, k, v, w, u, scale=None, initial_state=None, output_final_state=False,
                          reverse=False, cu_seqlens=None, *, backend="auto", interpret=False,
                          context_axis=None):
  return _run("fused_recurrent", r, k, v, w, u, scale, initial_state, output_final_state, reverse,
              cu_seqlens, backend, interpret, context_axis)


api.document(_DOC, chunk=chunk_rwkv6, fused_recurrent=fused_recurrent_rwkv6)
