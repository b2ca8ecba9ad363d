"""Gated delta rule (Gated DeltaNet): `chunk_gated_delta_rule`, `fused_recurrent_gated_delta_rule`,
and fla's aliases `chunk_gdn`, `fused_recurrent_gdn`."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from pallas_kernels.common import api
from pallas_kernels.common.chunk import l2norm
from pallas_kernels.gated_delta_rule.transition import TRANSITION

F32 = api.F32

_DOC = """Gated delta rule{kind} (fla's `{fla}_gated_delta_rule`).

  S_t = exp(g_t) S_{t-1};  S_t += k_t (beta_t (v_t - S_t^T k_t))^T;  o_t = S_t^T (scale q_t)

Args:
  q, k: [B, T, H, K]. v: [B, T, H, V], or fla's grouped value heads: v (and the gates, beta, the
    state) with a multiple of q's and k's heads, each q, k head serving consecutive value heads.
  g: [B, T, H] natural-log decays (<= 0; a positive value raises eagerly, is clamped to 0 under jit).
    fused_recurrent_gated_delta_rule: None means no scalar decay.
  gk, gv (fused_recurrent_gated_delta_rule): None, or [B, T, H, K] / [B, T, H, V] natural-log decays
    per key / value channel, applied with g: S_t = exp(g_t) diag(exp(gk_t)) S_{t-1} diag(exp(gv_t)).
    gk runs on every backend (as KDA's per-channel gate); gv only on the float32 scan ("xla",
    "reference"; "auto" takes it), and not with context_axis.
  beta: [B, T, H] write strengths (usually sigmoid outputs); fused_recurrent's default is ones, and
    it also takes [B, T, H, V], one per value channel (on the float32 scan, as gv).
  use_qk_l2norm_in_kernel: L2-normalise q and k over K first (as Gated DeltaNet layers do).
  use_gate_in_kernel, A_log [H], dt_bias None or [H] (chunk_gated_delta_rule reads them from its
    **kwargs, as fla's does): g is the raw gate, and the decay is -exp(A_log) softplus(g + dt_bias)
    (float32), Gated DeltaNet's.
  use_beta_sigmoid_in_kernel: beta holds logits, the write strength is sigmoid(beta) (float32);
    allow_neg_eigval (requires it): 2 sigmoid(beta), eigenvalues of the transition in (-1, 1).
  chunk_indices, cp_context (chunk_gated_delta_rule): fla's precomputed varlen chunk indices,
    accepted and not needed; fla's torch.distributed context, which raises (use context_axis).
"""


def _gate(g, A_log, dt_bias, d: api.Dims):
  """Gated DeltaNet's decay from the raw gate g [B, T, H]: -exp(A_log) softplus(g + dt_bias)."""
  g = api.gate("g", g, d, "[B, T, H]").astype(F32)
  if dt_bias is not None:
    g = g + api.gate("dt_bias", dt_bias, d, "[H]").astype(F32)
  return -jnp.exp(api.gate("A_log", A_log, d, "[H]").astype(F32)) * jax.nn.softplus(g)


def _run(kind, q, k, v, g, gk, gv, beta, scale, initial_state, output_final_state,
         use_qk_l2norm_in_kernel, use_gate_in_kernel, A_log, dt_bias, use_beta_sigmoid_in_kernel,
         allow_neg_eigval, state_v_first, cu_seqlens, backend, interpret, context_axis):
  q, k = api.grouped_value_heads(q, k, v)
  d = api.dims(q, k, v, cu_seqlens, context_axis=context_axis)
  if use_gate_in_kernel:
    if A_log is None:
      raise ValueError("`A_log` must be provided when `use_gate_in_kernel=True`.")
    if g is None:
      raise ValueError("`g` (raw pre-activation) must be provided when `use_gate_in_kernel=True`.")
    g = _gate(g, A_log, dt_bias, d)
  else:
    g = api.log_decay_gate("g", g, d, "[B, T, H]", optional=kind == "fused_recurrent")
  gk = api.log_decay_gate("gk", gk, d, "[B, T, H, K]", optional=True)
  gv = api.log_decay_gate("gv", gv, d, "[B, T, H, V]", optional=True)
  if beta is None and kind == "fused_recurrent":  # fla's default there; the chunk op needs beta
    beta = jnp.ones(q.shape[:3], F32)
  beta, per_channel_beta = api.delta_beta(beta, d, kind)
  beta = api.beta_activation(beta, use_beta_sigmoid_in_kernel, allow_neg_eigval)
  if use_qk_l2norm_in_kernel:
    q, k = l2norm(q), l2norm(k)
  options = dict(scale=scale, initial_state=initial_state, output_final_state=output_final_state,
                 cu_seqlens=cu_seqlens, interpret=interpret, context_axis=context_axis,
                 state_v_first=state_v_first, transition=TRANSITION)  # the delta rules share it
  if gk is not None:  # a per-channel decay: KDA's recurrence, with g folded in
    g = gk.astype(F32) + (0.0 if g is None else g.astype(F32)[..., None])
  if gv is not None or per_channel_beta:
    option = "gv" if gv is not None else "beta [B, T, H, V]"
    return api.run("gated_delta_rule", kind, d, (q, k, v, g, beta), gv=gv,
                   backend=api.only_on_scan(option, backend, context_axis), **options)
  if gk is not None:
    return api.run("kda", kind, d, (q, k, v, g, beta), backend=backend, **options)
  if g is None:
    return api.run("delta_rule", kind, d, (q, k, v, beta), backend=backend, **options)
  return api.run("gated_delta_rule", kind, d, (q, k, v, g, beta), backend=backend, **options)


def chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                           use_qk_l2norm_in_kernel=False, use_beta_sigmoid_in_kernel=False,
                           allow_neg_eigval=False, state_v_first=False, cu_seqlens=None,
                           cu_seqlens_cpu=None, chunk_indices=None, cp_context=None, *,
                           backend="auto", interpret=False, context_axis=None, **kwargs):
  state_v_first, gate = api.fla_kwargs("chunk_gated_delta_rule", kwargs, state_v_first=state_v_first,
                                       takes=("use_gate_in_kernel", "A_log", "dt_bias"))
  if cp_context is not None:
    raise ValueError("`cp_context` (fla's torch.distributed context parallelism) is not supported; "
                     "split T over a mesh axis with `context_axis` instead")
  return _run("chunk", q, k, v, g, None, None, beta, scale, initial_state, output_final_state,
              use_qk_l2norm_in_kernel, gate.get("use_gate_in_kernel", False), gate.get("A_log"),
              gate.get("dt_bias"), use_beta_sigmoid_in_kernel, allow_neg_eigval, state_v_first,
              cu_seqlens, backend, interpret, context_axis)


def fused_recurrent_gated_delta_rule(q, k, v, g=None, gk=None, gv=None, beta=None, scale=None,
                                     initial_state=None, output_final_state=False,
                                     use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False,
                                     A_log=None, dt_bias=None, use_beta_sigmoid_in_kernel=False,
                                     allow_neg_eigval=False, state_v_first=False, cu_seqlens=None, *,
                                     backend="auto", interpret=False, context_axis=None, **kwargs):
  state_v_first, _ = api.fla_kwargs("fused_recurrent_gated_delta_rule", kwargs,
                                    state_v_first=state_v_first)
  return _run("fused_recurrent", q, k, v, g, gk, gv, beta, scale, initial_state, output_final_state,
              use_qk_l2norm_in_kernel, use_gate_in_kernel, A_log, dt_bias, use_beta_sigmoid_in_kernel,
              allow_neg_eigval, state_v_first, cu_seqlens, backend, interpret, context_axis)


api.document(_DOC, chunk=chunk_gated_delta_rule, fused_recurrent=fused_recurrent_gated_delta_rule)

chunk_gdn = chunk_gated_delta_rule
fused_recurrent_gdn = fused_recurrent_gated_delta_rule
