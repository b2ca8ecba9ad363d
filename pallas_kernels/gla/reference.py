"""Gated linear attention, token by token in float32: the definition of every additive family.

  S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T      (g_t [B, T, H, K] per channel; [B, T, H] scalar)
  o_t = S_t^T (scale q_t)                        (GLA, simple GLA, retention, linear attention)
  o_t = (S_{t-1} + diag(u) k_t v_t^T)^T (scale r_t)   (RWKV-6, with the bonus u [H, K])
  S_t = diag(exp(g_t)) S_{t-1} diag(exp(gv_t)) + k_t v_t^T   (fla's per-value-channel gv [B, T, H, V])
"""
from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from pallas_kernels.common.scan import scan_with_resets
from pallas_kernels.common.varlen import token_segments

F32 = jnp.float32
HI = lax.Precision.HIGHEST


def gla(q, k, v, g, *, scale, initial_state, cu_seqlens=None, u=None, gv=None):
  """q, k [B, T, H, K]; v [B, T, H, V]; g None, [B, T, H] or [B, T, H, K]; u None or [H, K];
  gv None or [B, T, H, V].

  Returns (o [B, T, H, V] float32, final_state [N, H, K, V] float32).
  """
  B, T, H, K = q.shape
  q, k, v = (x.astype(F32) for x in (q, k, v))
  g = jnp.zeros((B, T, H), F32) if g is None else g.astype(F32)
  gv = jnp.zeros((B, T, H, 1), F32) if gv is None else gv.astype(F32)

  def step(S, x):
    q_t, k_t, v_t, g_t, gv_t = x
    decay = jnp.exp(g_t)[..., None] if g_t.ndim == 2 else jnp.exp(g_t)  # [B, H, 1 or K]
    kv = k_t[..., :, None] * v_t[..., None, :]
    S_next = S * decay[..., None] * jnp.exp(gv_t)[..., None, :] + kv
    read = S_next if u is None else S + u.astype(F32)[..., None] * kv
    return S_next, jnp.einsum("bhkv,bhk->bhv", read, q_t * scale, precision=HI)

  time_major = lambda x: jnp.moveaxis(x, 1, 0)
  segments = None if cu_seqlens is None else token_segments(cu_seqlens, T)
  S, o = scan_with_resets(step, initial_state, tuple(map(time_major, (q, k, v, g, gv))), segments)
  return jnp.moveaxis(o, 0, 1), S


def fused_recurrent_gla(q, k, v, g, *, scale, initial_state, cu_seqlens=None, u=None, gv=None):
  """`gla` with o in q.dtype (the decode path of every backend without a kernel)."""
  o, S = gla(q, k, v, g, scale=scale, initial_state=initial_state, cu_seqlens=cu_seqlens, u=u,
             gv=gv)
  return o.astype(q.dtype), S


chunk_gla = fused_recurrent_gla
