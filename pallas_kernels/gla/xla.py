"""Chunked gated linear attention in pure JAX: the one chunked core of every additive family.

Per chunk of C tokens with the gates g (float32; [.., C, K] per channel or [.., C, 1] scalar), their
chunk-local cumsum G and the state S (float32, K x V) at the chunk start:
  o    = (scale q exp(Gq)) S + A v,    A_ij = scale sum_c q_ic k_jc exp(sum_{j < r <= i} g_rc), j <= i
  S    = diag(exp(G_C)) S + (k exp(sum_{r > j} g_r))^T v
GLA, simple GLA, retention and linear attention read the state after their token: Gq = G, j <= i.
RWKV-6 (`u` given) reads it before: Gq is the exclusive cumsum, the sums in A run over j < r < i,
j < i, and it adds the diagonal bonus scale (q_i . (u k_i)) v_i. A comes from `gated_scores` (scalar
gates factor out; per-channel gates go through sub-chunks so no exponent is positive). Every gate
sum is taken over its own range, never as a difference of cumsums, so gates down to -inf (a decay
of 0) give exact zeros and large gates (|g| ~ 1e4) lose no precision.
"""
from __future__ import annotations

import jax.numpy as jnp

from pallas_kernels.common import varlen
from pallas_kernels.common.chunk import (CHUNK, F32, chunk_local_cumsum, from_chunks, gated_scores,
                                         mm, suffix_sum, to_chunks)
from pallas_kernels.common.scan import scan_with_resets
from pallas_kernels.gla.reference import fused_recurrent_gla  # noqa: F401


def chunk_gla(q, k, v, g, *, scale, initial_state, cu_seqlens=None, u=None,
              chunk_size: int = CHUNK):
  """q, k [B, T, H, K]; v [B, T, H, V]; g None, [B, T, H] or [B, T, H, K] log decays;
  u None, or the RWKV-6 bonus [H, K] (then o_t reads S_{t-1}).

  Returns (o [B, T, H, V] in q.dtype, final_state [N, H, K, V] float32).
  """
  B, T, H, K = q.shape
  dt, C = q.dtype, chunk_size
  g = jnp.zeros((B, T, H, 1), F32) if g is None else g.astype(F32)
  g = g[..., None] if g.ndim == 3 else g

  # Pad (and for varlen re-pack chunk-aligned) with zero tokens: k = 0, g = 0 leave the state as is.
  plan = varlen.chunk_plan(T, C, cu_seqlens)
  q, k, v, g = (to_chunks(varlen.to_chunked(x, plan), C) for x in (q, k, v, g))  # [B, H, N, C, .]

  exclusive = u is not None                                           # o_t reads S_{t-1}
  A = gated_scores(q, k, g, dt, strict=exclusive, exclusive=exclusive) * scale
  o = mm("bhnij,bhnjv->bhniv", A, v, dt)
  if u is not None:
    u = u.astype(F32)[None, :, None, None, :]                          # [1, H, 1, 1, K]
    bonus = jnp.sum(q.astype(F32) * u * k.astype(F32), -1, keepdims=True) * scale
    o = o + bonus * v.astype(F32)

  # Gate sums over their own ranges (see common.chunk): -inf gates give exact zeros, never NaN.
  Gq = chunk_local_cumsum(g, axis=-2, exclusive=exclusive)            # [B, H, N, C, K or 1]
  k_out = (k.astype(F32) * jnp.exp(suffix_sum(g, axis=-2))).astype(dt)
  decay_last = jnp.swapaxes(jnp.exp(jnp.sum(g, axis=-2, keepdims=True)), -1, -2)  # [B, H, N, K or 1, 1]

  def step(S, x):                                                     # S [B, H, K, V]
    k_c, v_c, d_c = x
    return S * d_c + mm("bhck,bhcv->bhkv", k_c, v_c, dt), S

  chunk_major = lambda x: jnp.moveaxis(x, 2, 0)
  S, S_in = scan_with_resets(step, initial_state, tuple(map(chunk_major, (k_out, v, decay_last))),
                             plan.segments)
  q_dec = q.astype(F32) * jnp.exp(Gq) * scale
  o = o + mm("bhnck,bhnkv->bhncv", q_dec, jnp.moveaxis(S_in, 0, 2), dt)
  return varlen.from_chunked(from_chunks(o.astype(dt)), plan), S
