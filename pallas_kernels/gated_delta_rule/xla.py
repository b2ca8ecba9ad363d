"""Chunked gated delta rule in pure JAX (any platform; differentiable by autodiff).

Per chunk of C tokens (chunk-local gate cumsum G, scalar or per channel), the WY/UT form turns the
C sequential rank-1 updates into matmuls:
  A    = strict_lower(beta_i k_i . k_j exp(G_i - G_j))           (decayed key scores)
  T    = (I + A)^-1                                              (float32, unit lower triangular)
  w    = T (beta k exp(G)),   u = T (beta v)
then one sequential pass over chunks with the state S (float32) at each chunk start:
  v'   = u - w S
  o    = (scale q exp(G)) S + lower(scale q_i . k_j exp(G_i - G_j)) v'
  S    = exp(G_C) S + (k exp(G_C - G))^T v'
where every G_i - G_j is computed as the sum of g over (j, i] (see common.chunk), so gates down to
-inf (a decay of 0) give exact zeros, and large gates (|g| ~ 1e4) lose no precision.
The same code runs the delta rule (no gate) and KDA (per-channel gate, `g` [B, T, H, K]).
"""
from __future__ import annotations

import jax.numpy as jnp

from pallas_kernels.common import varlen
from pallas_kernels.common.chunk import (CHUNK, F32, chunk_local_cumsum, from_chunks, gated_scores,
                                         mm, suffix_sum, to_chunks, unit_lower_inverse)
from pallas_kernels.common.scan import scan_with_resets
from pallas_kernels.gated_delta_rule.reference import fused_recurrent_gated_delta_rule  # noqa: F401


def chunk_gated_delta_rule(q, k, v, g, beta, *, scale, initial_state, cu_seqlens=None,
                           chunk_size: int = CHUNK):
  """q, k [B, T, H, K]; v [B, T, H, V]; g None, [B, T, H] or [B, T, H, K]; beta [B, T, H].

  Returns (o [B, T, H, V] in q.dtype, final_state [N, H, K, V] float32).
  """
  B, T, H, K = q.shape
  dt, C = q.dtype, chunk_size
  g = jnp.zeros((B, T, H, 1), F32) if g is None else g.astype(F32)
  g = g[..., None] if g.ndim == 3 else g
  beta = beta.astype(F32)[..., None]

  # Pad (and for varlen re-pack chunk-aligned) with tokens that leave the state unchanged.
  plan = varlen.chunk_plan(T, C, cu_seqlens)
  q, k, v, g, beta = (to_chunks(varlen.to_chunked(x, plan), C)
                      for x in (q, k, v, g, beta))                  # [B, H, N, C, .]

  # Gate sums over their own ranges (see common.chunk): -inf gates give exact zeros, never NaN.
  G = chunk_local_cumsum(g, axis=-2)                                 # [B, H, N, C, K or 1]
  kb = k.astype(F32) * beta
  A = gated_scores(kb, k, g, dt, strict=True)
  Tinv = unit_lower_inverse(A)
  w = mm("...ij,...jk->...ik", Tinv, kb * jnp.exp(G), F32).astype(dt)
  # u stays float32: it is no matmul input (v' = u - w S), and it nearly cancels against w S when
  # the state is saturated (delta rule, small K), so rounding it to bf16 would cost accuracy.
  u = mm("...ij,...jv->...iv", Tinv, v.astype(F32) * beta, F32)
  Aqk = gated_scores(q, k, g, dt) * scale
  k_out = (k.astype(F32) * jnp.exp(suffix_sum(g, axis=-2))).astype(dt)
  decay_last = jnp.swapaxes(jnp.exp(G[..., -1:, :]), -1, -2)         # [B, H, N, K or 1, 1]

  def step(S, x):                                                     # S [B, H, K, V]
    w_c, u_c, k_c, d_c = x
    v_new = u_c.astype(F32) - mm("bhck,bhkv->bhcv", w_c, S, dt)
    S_next = S * d_c + mm("bhck,bhcv->bhkv", k_c, v_new, dt)
    return S_next, (S, v_new)

  chunk_major = lambda x: jnp.moveaxis(x, 2, 0)
  S, (S_in, v_new) = scan_with_resets(step, initial_state, tuple(map(chunk_major, (w, u, k_out, decay_last))),
                                      plan.segments)
  S_in, v_new = jnp.moveaxis(S_in, 0, 2), jnp.moveaxis(v_new, 0, 2)  # [B, H, N, ...]
  q_dec = q.astype(F32) * jnp.exp(G) * scale
  o = mm("bhnck,bhnkv->bhncv", q_dec, S_in, dt) + mm("bhnij,bhnjv->bhniv", Aqk, v_new, dt)
  return varlen.from_chunked(from_chunks(o.astype(dt)), plan), S
