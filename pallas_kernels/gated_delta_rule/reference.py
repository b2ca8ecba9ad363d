"""The gated delta rule, token by token in float32: the definition every other path is tested against.

  S_t = exp(g_t) S_{t-1}                (g_t [B, T, H] scalar; [B, T, H, K] per channel for KDA)
  S_t = S_t diag(exp(gv_t))             (only with gv [B, T, H, V], fla's per-value-channel decay)
  u_t = beta_t (v_t - S_t^T k_t)        (beta_t [B, T, H], or [B, T, H, V] per value channel)
  S_t = S_t + k_t u_t^T
  o_t = S_t^T (scale q_t)
"""
from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from pallas_kernels.common.scan import scan_with_resets
from pallas_kernels.common.varlen import token_segments

F32 = jnp.float32
HI = lax.Precision.HIGHEST


def gated_delta_rule(q, k, v, g, beta, *, scale, initial_state, cu_seqlens=None, gv=None):
  """Returns (o [B, T, H, V] float32, final_state [N, H, K, V] float32)."""
  B, T, H, K = q.shape
  q, k, v, beta = (x.astype(F32) for x in (q, k, v, beta))
  g = jnp.zeros((B, T, H), F32) if g is None else g.astype(F32)
  gv = jnp.zeros(v.shape[:3] + (1,), F32) if gv is None else gv.astype(F32)

  def step(S, x):
    q_t, k_t, v_t, g_t, gv_t, b_t = x
    decay = jnp.exp(g_t)[..., None] if g_t.ndim == 2 else jnp.exp(g_t)  # [B, H, 1 or K]
    S = S * decay[..., None] * jnp.exp(gv_t)[..., None, :]
    b_t = b_t if b_t.ndim == 3 else b_t[..., None]  # per value channel, or one per head
    u = b_t * (v_t - jnp.einsum("bhkv,bhk->bhv", S, k_t, precision=HI))
    S = S + k_t[..., :, None] * u[..., None, :]
    return S, jnp.einsum("bhkv,bhk->bhv", S, q_t * scale, precision=HI)

  time_major = lambda x: jnp.moveaxis(x, 1, 0)
  segments = None if cu_seqlens is None else token_segments(cu_seqlens, T)
  S, o = scan_with_resets(step, initial_state, tuple(map(time_major, (q, k, v, g, gv, beta))),
                          segments)
  return jnp.moveaxis(o, 0, 1), S


def fused_recurrent_gated_delta_rule(q, k, v, g, beta, *, scale, initial_state, cu_seqlens=None,
                                     gv=None):
  o, S = gated_delta_rule(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                          cu_seqlens=cu_seqlens, gv=gv)
  return o.astype(q.dtype), S


chunk_gated_delta_rule = fused_recurrent_gated_delta_rule
