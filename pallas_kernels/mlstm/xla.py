"""Chunked mLSTM in pure JAX (any platform; differentiable by autodiff), in mlstm_kernels' chunkwise
form with a chunk-local stabilizer (README.md has the derivation).

Per chunk of C tokens, with b the chunk-local inclusive cumsum of logf (float32), g = b_C,
D_ts = sum_{s < r <= t} logf_r and a_s = sum_{r > s} logf_r + i_s (log weight of s's write at the end):
  m_loc = max_s a_s                                     (chunk-local stabilizer, no state needed)
  C_loc = (k exp(a - m_loc))^T v,  n_loc = sum_s exp(a_s - m_loc) k_s        (batched matmuls)
one sequential pass over chunks with the state (C, n, m) at each chunk start (float32):
  m' = max(g + m, m_loc);  C' = exp(g + m - m') C + exp(m_loc - m') C_loc  (n likewise)
which is exactly the recurrence's m at the chunk end, and then, batched over chunks, the outputs with
the recurrence's own m_t = max(b_t + m, max_{s<=t} (D_ts + i_s)):
  P    = lower(scale q_t . k_s exp(D_ts + i_s - m_t));   q~ = scale q_t exp(b_t + m - m_t)
  o_t  = (q~ C + P v) / (max(|q~ . n + sum_s P_ts|, exp(-m_t)) + EPS)
D and a are summed over their own ranges, not taken as differences of b (which loses precision once
b is in the hundreds). Every exp is of a masked, non-positive difference, with the large terms (the
stabilizers, the input gates) differenced first and the log f sums added after, as in reference.py.
Padding tokens (ragged T, varlen re-packing) have q = k = v = 0, logf = 0 and i = -1e30, which
leaves (C, n, m) unchanged.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from pallas_kernels.common import varlen
from pallas_kernels.common.chunk import (CHUNK, F32, causal_mask, chunk_local_cumsum, from_chunks,
                                         mm, segment_sums, suffix_sum, to_chunks)
from pallas_kernels.common.scan import scan_with_resets
from pallas_kernels.mlstm.reference import EPS, fused_recurrent_mlstm, normalizer_floor  # noqa: F401

NO_INPUT = -1e30  # input-gate value of padding tokens: exp(i - m) == 0, finite so no NaN in gradients


def chunk_mlstm(q, k, v, i, f, *, scale, initial_state, cu_seqlens=None, chunk_size: int = CHUNK):
  """q, k [B, T, H, K]; v [B, T, H, V]; i, f [B, T, H] pre-activations.

  Returns (o [B, T, H, V] in q.dtype, (C [N, H, K, V], n [N, H, K], m [N, H]) float32).
  """
  B, T, H, K = q.shape
  dt, C = q.dtype, chunk_size
  i, logf = i.astype(F32), jax.nn.log_sigmoid(f.astype(F32))

  plan = varlen.chunk_plan(T, C, cu_seqlens)
  q, k, v, logf = (varlen.to_chunked(x, plan) for x in (q, k, v, logf))
  i = varlen.to_chunked(i, plan, NO_INPUT)
  q, k, v, i, logf = (to_chunks(x, C) for x in (q, k, v, i, logf))   # [B, H, N, C, .]

  b = chunk_local_cumsum(logf)                                       # [B, H, N, C]
  g = b[..., -1]                                                     # [B, H, N]
  suffix = suffix_sum(logf)                                          # g - b, summed directly
  m_loc = jnp.max(suffix + i, axis=-1)
  k_w = k.astype(F32) * jnp.exp((i - m_loc[..., None]) + suffix)[..., None]  # [B, H, N, C, K]
  C_loc = mm("bhnck,bhncv->bhnkv", k_w, v, dt)
  n_loc = jnp.sum(k_w, axis=-2)

  def step(state, x):                                 # C [B, H, K, V], n [B, H, K], m [B, H]
    Cs, ns, ms = state
    g_c, m_loc_c, C_loc_c, n_loc_c = x
    m_next = jnp.maximum(g_c + ms, m_loc_c)
    decay, inject = jnp.exp((ms - m_next) + g_c)[..., None], jnp.exp(m_loc_c - m_next)[..., None]
    nxt = (decay[..., None] * Cs + inject[..., None] * C_loc_c, decay * ns + inject * n_loc_c, m_next)
    return nxt, state

  chunk_major = lambda x: jnp.moveaxis(x, 2, 0)
  state, starts = scan_with_resets(step, tuple(initial_state), tuple(map(chunk_major, (g, m_loc, C_loc, n_loc))),
                                   plan.segments)
  C0, n0, m0 = (jnp.moveaxis(s, 0, 2) for s in starts)               # [B, H, N, ...]

  mask = causal_mask(C)
  D = segment_sums(logf[..., None])[..., 0]                         # [B, H, N, C, C]
  m_t = jnp.maximum(b + m0[..., None], jnp.max(jnp.where(mask, D + i[..., None, :], -jnp.inf), axis=-1))
  P = mm("bhnik,bhnjk->bhnij", q, k, dt) * scale * jnp.exp(
      jnp.where(mask, (i[..., None, :] - m_t[..., None]) + D, -jnp.inf))
  q_dec = q.astype(F32) * (scale * jnp.exp((m0[..., None] - m_t) + b))[..., None]
  num = mm("bhnck,bhnkv->bhncv", q_dec, C0, dt) + mm("bhnij,bhnjv->bhniv", P, v, dt)
  den = mm("bhnck,bhnk->bhnc", q_dec, n0, F32) + jnp.sum(P, axis=-1)
  o = num / (jnp.maximum(jnp.abs(den), normalizer_floor(m_t)) + EPS)[..., None]
  o = varlen.from_chunked(from_chunks(o.astype(dt)), plan)
  return o, state
