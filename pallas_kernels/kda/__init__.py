"""Kimi Delta Attention (KDA): `chunk_kda`, `fused_recurrent_kda`. The gated delta rule with a
per-channel decay: its backends are adapters onto `pallas_kernels.gated_delta_rule`'s."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from pallas_kernels.common import api, checks
from pallas_kernels.common.chunk import l2norm
from pallas_kernels.common.gpu.config import states_kept
from pallas_kernels.kda.transition import TRANSITION

F32 = api.F32

_DOC = """Kimi Delta Attention{kind} (fla's `{fla}_kda`).

  S_t = diag(exp(g_t)) S_{t-1};  S_t += k_t (beta_t (v_t - S_t^T k_t))^T;  o_t = S_t^T (scale q_t)

Args:
  q, k: [B, T, H, K]. v: [B, T, H, V], or fla's grouped value heads: v (and the gates, beta, the
    state) with a multiple of q's and k's heads, each q, k head serving consecutive value heads.
  g: [B, T, H, K] per-channel natural-log decays (<= 0; a positive value raises eagerly, is clamped
    to 0 under jit). Any magnitude is handled without overflow.
  beta: [B, T, H] write strengths (usually sigmoid outputs); fused_recurrent_kda also takes
    [B, T, H, V], one per value channel (only the float32 scan runs it: "xla", "reference",
    "auto"; not with context_axis).
  A_log [H], dt_bias None or [H * K] (chunk_kda reads them from its **kwargs, as fla's does), with
    use_gate_in_kernel: g is the raw gate, and the decay is -exp(A_log) softplus(g + dt_bias), or
    with lower_bound (< 0) lower_bound sigmoid(exp(A_log) (g + dt_bias)) (A_log may then be None:
    lower_bound sigmoid(g + dt_bias)); float32. Without use_gate_in_kernel, lower_bound is fla's
    hint that the gates are bounded, which no backend here needs.
  use_qk_l2norm_in_kernel: L2-normalise q and k over K first (as KDA layers do).
  use_beta_sigmoid_in_kernel: beta holds logits, the write strength is sigmoid(beta) (float32);
    allow_neg_eigval (requires it): 2 sigmoid(beta), eigenvalues of the transition in (-1, 1).
  chunk_kda's fla tuning options: disable_recompute=True has the GPU kernels' forward keep the
    states for the backward, as fla's keeps its intermediates (pallas_kernels.common.gpu.config's
    `states_kept`: more memory, no state pass in the backward; the other backends' results and
    memory are as without it); safe_gate (checked as fla checks it: with use_gate_in_kernel it
    needs lower_bound in [-5, 0)), use_graph and max_num_seqs are accepted and change nothing here
    (every backend handles any gate magnitude; shapes are static under jit and padded empty
    sequences are allowed); return_intermediate_states=True and cp_context raise.
"""


def _gate(g, A_log, dt_bias, lower_bound, d: api.Dims):
  """KDA's decay from the raw gate g [B, T, H, K] (see the docstring), in float32."""
  g = api.gate("g", g, d, "[B, T, H, K]").astype(F32)
  if dt_bias is not None:
    checks.check_rank("dt_bias", dt_bias, 1, "[H * K]")
    checks.check_shape("dt_bias", dt_bias, (d.H * d.K,), "[H * K]")
    checks.check_floating("dt_bias", dt_bias)
    g = g + dt_bias.astype(F32).reshape(d.H, d.K)
  A = None if A_log is None else jnp.exp(api.gate("A_log", A_log, d, "[H]").astype(F32))[:, None]
  if lower_bound is None:
    if A is None:
      raise ValueError("`A_log` must be provided when `use_gate_in_kernel=True` and `lower_bound` is "
                       "not set.")
    return -A * jax.nn.softplus(g)
  if not lower_bound < 0:
    raise ValueError(f"`lower_bound` must be < 0 (a log decay); got {lower_bound}")
  return lower_bound * jax.nn.sigmoid(g if A is None else A * g)


def _run(kind, q, k, v, g, beta, A_log, dt_bias, scale, initial_state, output_final_state,
         use_qk_l2norm_in_kernel, use_gate_in_kernel, use_beta_sigmoid_in_kernel, allow_neg_eigval,
         lower_bound, state_v_first, cu_seqlens, backend, interpret, context_axis):
  q, k = api.grouped_value_heads(q, k, v)
  d = api.dims(q, k, v, cu_seqlens, context_axis=context_axis)
  if use_gate_in_kernel:
    g = _gate(g, A_log, dt_bias, lower_bound, d)
  else:
    g = api.log_decay_gate("g", g, d, "[B, T, H, K]")
  beta, per_channel_beta = api.delta_beta(beta, d, kind)
  beta = api.beta_activation(beta, use_beta_sigmoid_in_kernel, allow_neg_eigval)
  if per_channel_beta:
    backend = api.only_on_scan("beta [B, T, H, V]", backend, context_axis)
  if use_qk_l2norm_in_kernel:
    q, k = l2norm(q), l2norm(k)
  return api.run("kda", kind, d, (q, k, v, g, beta), scale=scale, initial_state=initial_state,
                 output_final_state=output_final_state, cu_seqlens=cu_seqlens, backend=backend,
                 interpret=interpret, context_axis=context_axis, state_v_first=state_v_first,
                 transition=TRANSITION)


def chunk_kda(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
              use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False,
              allow_neg_eigval=False, safe_gate=False, lower_bound=None, disable_recompute=False,
              return_intermediate_states=False, state_v_first=False, cu_seqlens=None,
              cu_seqlens_cpu=None, cp_context=None, use_graph=False, max_num_seqs=None, *,
              backend="auto", interpret=False, context_axis=None, **kwargs):
  state_v_first, gate = api.fla_kwargs("chunk_kda", kwargs, state_v_first=state_v_first,
                                       takes=("A_log", "dt_bias"))
  if return_intermediate_states:
    raise ValueError("`return_intermediate_states=True` (fla's per-chunk states for inference "
                     "engines) is not supported by any backend here")
  if cp_context is not None:
    raise ValueError("`cp_context` (fla's torch.distributed context parallelism) is not supported; "
                     "split T over a mesh axis with `context_axis` instead")
  if safe_gate and use_gate_in_kernel:
    if lower_bound is None:
      raise ValueError("`lower_bound` must be specified when `safe_gate=True` and `use_gate_in_kernel=True`.")
    if not -5 <= lower_bound < 0:
      raise ValueError(f"`lower_bound` must be in the safe range [-5, 0), got {lower_bound}.")
  with states_kept(bool(disable_recompute)):
    return _run("chunk", q, k, v, g, beta, gate.get("A_log"), gate.get("dt_bias"), scale,
                initial_state, output_final_state, use_qk_l2norm_in_kernel, use_gate_in_kernel,
                use_beta_sigmoid_in_kernel, allow_neg_eigval, lower_bound, state_v_first,
                cu_seqlens, backend, interpret, context_axis)


def fused_recurrent_kda(q, k, v, g, beta, A_log=None, dt_bias=None, scale=None, initial_state=None,
                        output_final_state=False, use_qk_l2norm_in_kernel=False,
                        use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False,
                        allow_neg_eigval=False, lower_bound=None, state_v_first=False,
                        cu_seqlens=None, *, backend="auto", interpret=False, context_axis=None,
                        **kwargs):
  state_v_first, _ = api.fla_kwargs("fused_recurrent_kda", kwargs, state_v_first=state_v_first)
  return _run("fused_recurrent", q, k, v, g, beta, A_log, dt_bias, scale, initial_state,
              output_final_state, use_qk_l2norm_in_kernel, use_gate_in_kernel,
              use_beta_sigmoid_in_kernel, allow_neg_eigval, lower_bound, state_v_first, cu_seqlens,
              backend, interpret, context_axis)


api.document(_DOC, chunk=chunk_kda, fused_recurrent=fused_recurrent_kda)
