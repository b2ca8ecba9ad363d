"""mLSTM on TPU: a Mosaic kernel for the xLSTM mLSTM (exponential input gate, sigmoid forget gate in
log space, normalizer n and max-stabilizer m), forward and backward under one `jax.custom_vjp` (the
runner of common/tpu/state_kernel). `interpret=True` runs it in TPU interpret mode on any host.

The state is the tuple (C [K, V], n [1, K], m [1, 1]), three float32 VMEM scratches carried across
the chunk axis. Per chunk, with log f and the input gates i as rows [1, C] (computed outside;
padding tokens carry i = -1e30 so they write nothing), D_ts = sum_{s < r <= t} log f_r (one float32
matmul of 0/1 masks, summed over its own range: differences of cumsums lose precision once they
reach the hundreds) and b_t = sum_{r <= t} log f_r:
  L_ts = D_ts + i_s (s <= t),  m_t = max(b_t + m, max_s L_ts)          (the recurrence's m_t)
  P    = scale (q k^T) exp(L - m_t),  q~ = scale q exp(b_t + m - m_t)
  o    = (q~ C + P v) / (max(|q~ . n + sum_s P_ts|, exp(-m_t)) + eps)
  m'   = m_C,  w_s = exp(D_Cs + i_s - m'),  C' = exp(b_C + m - m') C + (k w)^T v,  n' likewise
Every exp is of a masked, non-positive difference, with the large terms (m, i) differenced first
and the log f sums added after (see reference.py); exp(-m_t) is capped as there. The backward kernel
differentiates exactly this, including the stabilizer path (max picks its argument; ties split
evenly, as jax's max does).
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from pallas_kernels.common.tpu import layout, state_kernel
from pallas_kernels.common.tpu.chunk_math import (F32, causal, col_to_row, dot, iota, masked_exp,
                                                  row, row_to_col)
from pallas_kernels.mlstm.reference import EPS, MAX_NEG_LOG_NORM, normalizer_floor
from pallas_kernels.mlstm.xla import NO_INPUT


class _Static(NamedTuple):
  N: int
  C: int
  scale: float
  eps: float
  interpret: object


class _Chunk(NamedTuple):
  L: jnp.ndarray       # [C, C] log weights D_ts + i_s (valid on s <= t)
  mrow: jnp.ndarray    # [C, 1] max_s L_ts
  x: jnp.ndarray       # [C, 1] b_t + m
  m: jnp.ndarray       # [C, 1] the stabilizer m_t
  E: jnp.ndarray       # [C, C] exp(L - m_t), masked
  P: jnp.ndarray       # [C, C]
  qdec: jnp.ndarray    # [C, 1] exp(b_t + m - m_t)
  qt: jnp.ndarray      # [C, K] scale q exp(b_t + m - m_t)
  num: jnp.ndarray     # [C, V]
  den: jnp.ndarray     # [C, 1]
  Z: jnp.ndarray       # [C, 1] max(|den|, exp(-m_t)) + eps
  m_end: jnp.ndarray   # [1, 1]
  decay: jnp.ndarray   # [1, 1] exp(b_C + m - m_end)
  w: jnp.ndarray       # [C, 1] exp(D_Cs + i_s - m_end)
  kw: jnp.ndarray      # [C, K] float32


def _masks(C: int):
  """(r <= t as [t, r], s < r as [r, s]) in float32: inclusive prefix and strict suffix sums."""
  t, r = iota((C, C), 0), iota((C, C), 1)
  return jnp.where(r <= t, 1.0, 0.0), jnp.where(r < t, 1.0, 0.0)


def _chunk(st: _Static, xs, S) -> _Chunk:
  q, k, v, lf_r, i_r = xs
  Cs, ns, ms = S
  dt, C = q.dtype, st.C
  mask = causal(C, False)
  incl, strict = _masks(C)
  D = dot(incl, row_to_col(lf_r) * strict, F32)               # D_ts = sum_{s < r <= t} log f_r
  b = jnp.sum(incl * lf_r, axis=1, keepdims=True)              # b_t = sum_{r <= t} log f_r
  L = D + i_r
  mrow = jnp.max(jnp.where(mask, L, -jnp.inf), axis=1, keepdims=True)  # the diagonal is always in
  x = b + ms
  m = jnp.maximum(x, mrow)
  E = masked_exp((i_r - m) + D, mask)
  P = dot(q, k, dt, tb=True) * st.scale * E
  qdec = jnp.exp((ms - m) + b)
  qt = q.astype(F32) * (st.scale * qdec)
  num = dot(qt, Cs, dt) + dot(P, v, dt)
  den = jnp.sum(qt * ns, axis=1, keepdims=True) + jnp.sum(P, axis=1, keepdims=True)
  Z = jnp.maximum(jnp.abs(den), normalizer_floor(m)) + st.eps
  m_end, g = row(m, C - 1), row(b, C - 1)
  w = jnp.exp(row_to_col((i_r - m_end) + row(D, C - 1)))
  return _Chunk(L, mrow, x, m, E, P, qdec, qt, num, den, Z, m_end, jnp.exp((ms - m_end) + g), w,
                k.astype(F32) * w)


def _forward(st: _Static, xs, S):
  c = _chunk(st, xs, S)
  Cs, ns, _ = S
  v = xs[2]
  C_next = c.decay * Cs + dot(c.kw, v, v.dtype, ta=True)
  n_next = c.decay * ns + jnp.sum(c.kw, axis=0, keepdims=True)
  return c.num / c.Z, (C_next, n_next, c.m_end)


def _max_weight(a, b):
  """d max(a, b) / da as jax assigns it: 1 where a > b, 1/2 on ties, else 0."""
  return jnp.where(a > b, 1.0, jnp.where(a == b, 0.5, 0.0))


def _backward(st: _Static, xs, S, do, dS):
  q, k, v, _, _ = xs
  Cs, ns, _ = S
  dC_next, dn_next, dm_next = dS
  dt, C, scale = q.dtype, st.C, st.scale
  c = _chunk(st, xs, S)
  mask = causal(C, False)
  rows = iota((C, 1), 0)
  # o = num / Z, Z = max(|den|, exp(-m)) + eps.
  do = do.astype(F32)
  dnum = do / c.Z
  dZ = -jnp.sum(do * c.num, axis=1, keepdims=True) / (c.Z * c.Z)
  em = normalizer_floor(c.m)
  wa = _max_weight(jnp.abs(c.den), em)
  dden = dZ * wa * jnp.where(c.den > 0, 1.0, jnp.where(c.den < 0, -1.0, 0.0))  # d|den|: sign
  uncapped = _max_weight(c.m, -MAX_NEG_LOG_NORM)               # d min(-m, cap) / d(-m)
  dm = -em * dZ * (1.0 - wa) * uncapped                         # cotangent of m_t, accumulated
  # num = q~ C + P v, den = q~ . n + sum_s P.
  dqt = dot(dnum, Cs, dt, tb=True) + dden * ns
  dCs = dot(c.qt, dnum, dt, ta=True) + c.decay * dC_next
  dns = jnp.sum(dden * c.qt, axis=0, keepdims=True) + c.decay * dn_next
  dP = jnp.where(mask, dot(dnum, v, dt, tb=True) + dden, 0.0)
  dv = dot(c.P, dnum, dt, ta=True) + dot(c.kw, dC_next, dt)
  # q~ = scale q exp(x - m), P = scale (q k^T) exp(L - m).
  dz = jnp.sum(dqt * c.qt, axis=1, keepdims=True)              # d(x - m)
  dQK = dP * c.E * scale
  dq = dqt * (scale * c.qdec) + dot(dQK, k, dt)
  dL = dP * c.P
  dm = dm - dz - jnp.sum(dL, axis=1, keepdims=True)
  # State: C' = decay C + (k w)^T v, n' = decay n + sum_s k_s w_s, m' = m_C.
  ddecay = (jnp.sum(jnp.sum(Cs * dC_next, axis=1, keepdims=True), axis=0, keepdims=True)
            + jnp.sum(ns * dn_next, axis=1, keepdims=True))
  dkw = dot(v, dC_next, dt, tb=True) + dn_next
  dk = dot(dQK, q, dt, ta=True) + dkw * c.w
  dw = jnp.sum(dkw * k.astype(F32), axis=1, keepdims=True) * c.w  # d(log w_s)
  zdec = ddecay * c.decay                                       # d(b_C + m - m'), b_C = sum log f
  sum_dw = jnp.sum(dw, axis=0, keepdims=True)
  dm = dm + jnp.where(rows == C - 1, dm_next - zdec - sum_dw, 0.0)
  # m_t = max(x_t, max_s L_ts), x = b + m.
  wx = _max_weight(c.x, c.mrow)
  dx = dm * wx + dz
  hit = jnp.where(mask & (c.L == c.mrow), 1.0, 0.0)
  dL = dL + hit * (dm * (1.0 - wx) / jnp.sum(hit, axis=1, keepdims=True))
  dms = zdec + jnp.sum(dx, axis=0, keepdims=True)
  # L = D + i, D = incl diag(log f) strict; log w_s = sum_{r > s} log f_r + i_s - m'; x = b + m.
  incl, strict = _masks(C)
  dw_r = col_to_row(dw)
  dlf = (col_to_row(jnp.sum(dot(incl, dL, F32, ta=True) * strict, axis=1, keepdims=True)
                    + jnp.sum(strict * dw_r, axis=1, keepdims=True))
         + jnp.sum(incl * dx, axis=0, keepdims=True) + zdec)
  di = jnp.sum(dL, axis=0, keepdims=True) + dw_r
  return (dq, dk, dv, dlf, di), (dCs, dns, dms)


KERNEL = state_kernel.StateKernel("mlstm", _forward, _backward)


# The largest float32 state block [K, V] a grid step holds: 512 x 512 (1 MiB) compiles within v5e's
# scoped VMEM beside the double-buffered state inputs and outputs; K = V = 1,024 (4 MiB) does not.
MAX_STATE_BLOCK = 512 * 512
LANES = 128


def value_block(K: int, V: int) -> int:
  """The width of the value tiles: V itself while the [K, V] state fits MAX_STATE_BLOCK (or V is
  not a multiple of 128), else the widest multiple of 128 that divides V and fits."""
  if K * V <= MAX_STATE_BLOCK or V % LANES:
    return V
  block = max(LANES, MAX_STATE_BLOCK // K // LANES * LANES)
  while V % block:
    block -= LANES
  return block


def _split_values(x, tiles: int):
  """[A, H, ..., V] -> [A, H * tiles, ..., V / tiles]: value tile j of head h becomes head
  h * tiles + j."""
  A, H, *mid, V = x.shape
  x = jnp.moveaxis(x.reshape(A, H, *mid, tiles, V // tiles), -2, 2)
  return x.reshape(A, H * tiles, *mid, V // tiles)


def _merge_values(x, tiles: int):
  """The inverse of `_split_values`."""
  A, Ht, *mid, BV = x.shape
  x = jnp.moveaxis(x.reshape(A, Ht // tiles, tiles, *mid, BV), 2, -2)
  return x.reshape(A, Ht // tiles, *mid, tiles * BV)


def chunk_mlstm(q, k, v, i, f, *, scale, initial_state, cu_seqlens=None, interpret=False,
                chunk_size: int = 64):
  """q, k [B, T, H, K]; v [B, T, H, V]; i, f [B, T, H] pre-activations.

  Returns (o [B, T, H, V] in q.dtype, (C [N, H, K, V], n [N, H, K], m [N, H]) float32), exactly
  like xla.py.

  Heads whose state exceeds MAX_STATE_BLOCK split V into tiles (`value_block`): each column of C
  evolves on its own, so each tile runs as a head of its own on the head grid axis, with its
  [K, V / tiles] slices of C and v and with q, k and the gate rows repeated; n and m do not depend
  on V, so every tile computes them alike and tile 0's are returned (autodiff sums the tiles'
  gradients of what they share).
  """
  tiles = v.shape[-1] // value_block(q.shape[-1], v.shape[-1])
  p, (q, k, v) = layout.qkv_inputs(q, k, v, cu_seqlens, chunk_size)
  C0, n0, m0 = initial_state
  logf = layout.to_rows(layout.to_kernel(jax.nn.log_sigmoid(f.astype(F32)), p, F32), p)
  i = layout.to_rows(layout.to_kernel(i, p, F32, pad_value=NO_INPUT), p)
  n0, m0 = n0[:, :, None], m0[:, :, None, None]
  if tiles > 1:
    q, k, logf, i, n0, m0 = (jnp.repeat(x, tiles, axis=1) for x in (q, k, logf, i, n0, m0))
    v, C0 = _split_values(v, tiles), _split_values(C0, tiles)
  st = _Static(p.N, p.C, float(scale), EPS, interpret)
  o, (C, n, m) = state_kernel.run(KERNEL, st, p, (q, k, v, logf, i), (C0, n0, m0))
  if tiles > 1:
    o, C = _merge_values(o, tiles), _merge_values(C, tiles)
    n, m = n[:, ::tiles], m[:, ::tiles]
  return layout.from_kernel(o, p), (C, n[:, :, 0], m[:, :, 0, 0])
