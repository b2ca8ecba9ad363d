"""KDA as Pallas GPU kernels (Triton lowering), with its custom_vjp: the gated delta rule's WY/UT
kernels with a per-channel decay.

G is the chunk-local cumsum of g [C, K] (float32, token layout [B, T, H, K]), C = 64. Per-channel
decays do not factor out of the intra-chunk products, so both score matrices of a chunk,

  A_ij = beta_i sum_c k_ic k_jc exp(G_ic - G_jc)   (j < i: the WY/UT system (I + A) U = ...)
  P_ij = scale sum_c q_ic k_jc exp(G_ic - G_jc)    (j <= i: the output's intra-chunk scores)

are formed in 16-row sub-chunks: a block p of rows against the keys of earlier blocks is one dot
with both sides taken relative to the block's first row r, exp(G_i - G_r) and exp(G_r - G_j), both
<= 1; the diagonal 16 x 16 block goes key by key, last to first, with its decays
exp(G_i - G_j) = exp(G_i - G_{j+1}) exp(G_{j+1} - G_j) (`_diagonal_decay`). No exponent is ever
positive, so any gate magnitude is safe without a lower bound on g (fla's KDA needs one: its issue
#701). The backward takes the same factorisation in reverse.

forward
  1. `_wy_fwd`                grid (NT, B*H): A and P by sub-chunks, T = (I + A)^-1 (float32, by
                              common/gpu/kernel_math's block inverse), w = T (beta exp(G) k),
                              u = T (beta v); T and P stored in the input dtype for the backward.
  2. `chunk_state.state_pass` (per-channel gates, P given): v' = u - w S;
                              o = scale (exp(G) q) S + P v';
                              S = diag(exp(G_C)) S + (exp(G_C - G) k)^T v'.
backward (residuals: the inputs, w, u, T and P; the states are recomputed)
  3. `chunk_state.state_pass` the chunk-start states h and v'.
  4. `chunk_dh.dh_pass`       dh, dv' = P^T do + exp(G_C - G) k dh, d initial_state.
  5. `chunk_dqk.dqk_pass`     the state parts of dq, dk and dG, and dw = -dv' h^T.
  6. `_bwd_wy`                grid (NT, B*H), per 16-row block: back through w, u and T
                              (dA = -T^T dT T^T) and through A and P by sub-chunks (dP = scale
                              do v'^T): the rest of dq, dk and dG, dv and dbeta; dg is the reverse
                              chunk-local cumsum of dG.

Supported as the gated delta rule's kernels (common/gpu/layout.py's `run_chunked`): any B, T, H;
K and V up to 256 (a wider V as slices); bf16, f16 and f32; initial / final state and cu_seqlens.
`fused_recurrent_kda` is common/gpu/fused_recurrent.py's decode kernel with the per-channel gate.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from pallas_kernels.common.gpu import chunk_dh, chunk_dqk, chunk_state, layout
from pallas_kernels.common.gpu.config import CHUNK, DEFAULT, Config, Static
from pallas_kernels.common.gpu.fused_recurrent import fused_recurrent
from pallas_kernels.common.gpu.kernel_math import (F32, SUB, block_unit_lower_inverse, dot, dot_nt,
                                                   dot_tn, iota, precision)
from pallas_kernels.common.gpu.layout import Specs, chunk_cumsum, launch, run_chunked, sds
from pallas_kernels.kda import reference

unsupported = layout.unsupported  # the dispatch `supports` hook: reason or None

_NEG = -jnp.inf


def _masked_exp(mask, x):
  """exp(x) where mask, else 0, masked before the exp (x may be positive off the mask)."""
  return jnp.exp(jnp.where(mask, x, _NEG))


def _diagonal_decay(g_ref, j, t, E, sub_row):
  """exp(G_i - G_j) [16, K] for the rows i >= j of key j's 16-row block (j its row t; 0 above),
  from E, the same of key j + 1: E exp(G_{j+1} - G_j), row t set to 1. The diagonal loops walk the block's keys last to
  first, so each key costs one exp of a [K] row of (non-positive) decays, not of [16, K]."""
  nxt = jnp.minimum(j + 1, g_ref.shape[0] - 1)  # the block's last key: E is all zero, any factor
  step = jnp.exp(g_ref[nxt, :] - g_ref[j, :])[None, :]
  return jnp.where(sub_row == t, 1.0, E * step)


# --- 1. the sub-chunk scores and the WY/UT transform ----------------------------------------------

def _wy_fwd_kernel(q_ref, k_ref, v_ref, g_ref, b_ref, w_ref, u_ref, t_ref, p_ref, *, scale):
  C, K = k_ref.shape
  n = C // SUB
  rows = [pl.ds(p * SUB, SUB) for p in range(n)]
  dt = k_ref.dtype
  prec = precision(dt)
  ks = [k_ref[r, :] for r in rows]
  Gs = [g_ref[r, :] for r in rows]
  bs = [b_ref[r] for r in rows]
  sub_row, col = iota((SUB, K), 0), iota((SUB, SUB), 1)
  A = [[None] * n for _ in range(n)]
  P = [[None] * n for _ in range(n)]
  for p in range(n):
    q32, k32 = q_ref[rows[p], :].astype(F32), ks[p].astype(F32)
    if p:  # the keys of blocks q < p, both sides relative to the block's first row r
      g_r = g_ref[p * SUB, :][None, :]
      e_p = jnp.exp(Gs[p] - g_r)
      qa, ka = (q32 * e_p).astype(dt), (k32 * e_p).astype(dt)
      for q in range(p):
        kb = (ks[q].astype(F32) * jnp.exp(g_r - Gs[q])).astype(dt)
        A[p][q] = dot_nt(ka, kb, prec) * bs[p][:, None]
        P[p][q] = dot_nt(qa, kb, prec) * scale

    def diagonal(i, carry, p=p, q32=q32, k32=k32):
      Ad, Pd, E = carry
      t = SUB - 1 - i
      j = p * SUB + t
      E = _diagonal_decay(g_ref, j, t, E, sub_row)
      kE = k_ref[j, :].astype(F32)[None, :] * E
      Ad = jnp.where(col == t, jnp.sum(k32 * kE, axis=1)[:, None], Ad)
      Pd = jnp.where(col == t, jnp.sum(q32 * kE, axis=1)[:, None], Pd)
      return Ad, Pd, E

    zero = jnp.zeros((SUB, SUB), F32)
    Ad, Pd, _ = lax.fori_loop(0, SUB, diagonal, (zero, zero, jnp.zeros((SUB, K), F32)))
    A[p][p] = jnp.where(iota((SUB, SUB), 0) > col, Ad, 0.0) * bs[p][:, None]
    P[p][p] = Pd * scale
  T = block_unit_lower_inverse(A, prec)
  kb = [(ks[q].astype(F32) * (bs[q][:, None] * jnp.exp(Gs[q]))).astype(dt) for q in range(n)]
  vb = [(v_ref[rows[q], :].astype(F32) * bs[q][:, None]).astype(dt) for q in range(n)]
  zero = jnp.zeros((SUB, SUB), dt)
  for p in range(n):
    Tp = [T[p][q].astype(dt) for q in range(p + 1)]
    for q in range(n):
      t_ref[rows[p], rows[q]] = Tp[q] if q <= p else zero
      p_ref[rows[p], rows[q]] = P[p][q].astype(dt) if q <= p else zero
    w_ref[rows[p], :] = sum(dot(Tp[q], kb[q], prec) for q in range(p + 1)).astype(w_ref.dtype)
    u_ref[rows[p], :] = sum(dot(Tp[q], vb[q], prec) for q in range(p + 1)).astype(u_ref.dtype)


def _wy_fwd(q, k, v, G, beta, st: Static):
  """Returns w [B, T, H, K], u [B, T, H, V], the chunk inverses T and the scores P
  [B, T, H, C] (all in the input dtype)."""
  B, T, H, K = k.shape
  V = v.shape[-1]
  sp = Specs(H, CHUNK, T)
  kern = functools.partial(_wy_fwd_kernel, scale=st.scale)
  chunk_rows = sds((B, T, H, CHUNK), k.dtype)
  return launch(kern, (sp.NT, B * H),
               [sp.chunk_tok(K), sp.chunk_tok(K), sp.chunk_tok(V), sp.chunk_gate(K), sp.chunk_gate()],
               [sp.chunk_tok(K), sp.chunk_tok(V), sp.chunk_tok(CHUNK), sp.chunk_tok(CHUNK)],
               [sds(k.shape, k.dtype), sds(v.shape, k.dtype), chunk_rows, chunk_rows], st,
               st.cfg.warps_wy_channel, st.cfg.stages_chunk)(q, k, v, G, beta)


# --- 6. back through the WY/UT transform and the sub-chunk scores ---------------------------------

def _bwd_wy_kernel(q_ref, k_ref, v_ref, g_ref, b_ref, t_ref, do_ref, vn_ref, dw_ref, du_ref,
                   dq1_ref, dk1_ref, dg1_ref, dq_ref, dk_ref, dv_ref, db_ref, dg_ref, *, scale, bv):
  """w = T (beta exp(G) k), u = T (beta v), T = (I + A)^-1 (the forward's, input dtype); o's
  intra-chunk part P v'. dq1, dk1, dg1: the state parts (chunk_dqk), float32.

  The score gradients dA (strict lower) and dP (lower) are formed in 16-row blocks from refs (a
  block of rows of T^T dT T^T is (T[:, block])^T (dT T^T), of columns (T^T dT) T[block, :]^T). For
  a score matrix M_ij = sum_c a_ic b_jc exp(G_ic - G_jc) (P: a = scale q, A: a = beta k; b = k
  for both) the row side sum_j dM_ij b_j exp(G_i - G_j) and the column side
  sum_i dM_ij a_i exp(G_i - G_j) take the forward's factorisation: earlier (later) blocks relative
  to the block's first (last) row, the diagonal block key by key."""
  C, K = k_ref.shape
  V = v_ref.shape[1]
  n = C // SUB
  dt = k_ref.dtype
  prec = precision(dt)
  beta, Tc = b_ref[...], t_ref[...]
  kb = k_ref[...].astype(F32) * (beta[:, None] * jnp.exp(g_ref[...]))      # w = T kb
  dT = dot_nt(dw_ref[...], kb.astype(dt), prec)
  for j in range(V // bv):
    vs = pl.ds(j * bv, bv)
    dT += dot_nt(du_ref[:, vs], (v_ref[:, vs].astype(F32) * beta[:, None]).astype(dt), prec)
  dT = dT.astype(dt)
  dTTt = dot_nt(dT, Tc, prec).astype(dt)                # dA rows of block p: -T[:, p]^T dTTt
  TtdT = dot_tn(Tc, dT, prec).astype(dt)                # dA columns of block p: -TtdT T[p, :]^T
  tok_row, sub_row = iota((C, K), 0), iota((SUB, K), 0)
  row_c, col_c = iota((SUB, C), 0), iota((SUB, C), 1)
  for p in range(n):  # (whole-chunk operands are loaded where used: fewer live registers)
    rows = pl.ds(p * SUB, SUB)
    r0, r1 = p * SUB, p * SUB + SUB - 1
    Tp = t_ref[:, rows]                                  # T[:, block p]: [C, 16]
    q, kp, Gp, bp = q_ref[rows, :].astype(F32), k_ref[rows, :].astype(F32), g_ref[rows, :], b_ref[rows]
    # the WY part of this block's rows
    dvb = dot_tn(Tp, du_ref[...], prec)                  # (T^T du)[block p]: [16, V]
    dv_ref[rows, :] = (dvb * bp[:, None]).astype(dv_ref.dtype)
    dbeta = jnp.sum(dvb * v_ref[rows, :].astype(F32), axis=1)
    dkb = dot_tn(Tp, dw_ref[...], prec)                  # (T^T dw)[block p]: [16, K]
    e_G = jnp.exp(Gp)
    dk = dk1_ref[rows, :] + dkb * (bp[:, None] * e_G)
    dbeta += jnp.sum(dkb * kp * e_G, axis=1)
    dG = dg1_ref[rows, :] + dkb * kp * (bp[:, None] * e_G)
    # this block's rows of dP (lower) and dA (strict lower)
    dPp = jnp.where(col_c <= row_c + r0, dot_nt(do_ref[rows, :], vn_ref[...], prec) * scale, 0.0)
    dAp = jnp.where(col_c < row_c + r0, -dot_tn(Tp, dTTt, prec), 0.0)
    dq = jnp.zeros((SUB, K), F32)
    RA = jnp.zeros((SUB, K), F32)                        # sum_j dA_ij k_j exp(G_i - G_j)
    if p:  # row side, keys of earlier blocks relative to the first row r0
      g_r = g_ref[r0, :][None, :]
      kr = (k_ref[...].astype(F32) * _masked_exp(tok_row < r0, g_r - g_ref[...])).astype(dt)
      e_p = jnp.exp(Gp - g_r)
      dq += dot(dPp.astype(dt), kr, prec) * e_p
      RA += dot(dAp.astype(dt), kr, prec) * e_p
    dkc = jnp.zeros((SUB, K), F32)                       # column side
    if p < n - 1:  # queries of later blocks relative to the last row r1
      g_e = g_ref[r1, :][None, :]
      later = _masked_exp(tok_row > r1, g_ref[...] - g_e)
      qa = (q_ref[...].astype(F32) * later).astype(dt)
      ba = (k_ref[...].astype(F32) * (later * beta[:, None])).astype(dt)
      # this block's columns of dP and dA; `later` zeroes the rows they would need masked
      dPc = dot_nt(do_ref[...], vn_ref[rows, :], prec) * scale
      dAc = -dot_nt(TtdT, t_ref[rows, :], prec)
      dkc += (dot_tn(dPc.astype(dt), qa, prec) + dot_tn(dAc.astype(dt), ba, prec)) * jnp.exp(g_e - Gp)
    bq = kp * bp[:, None]

    def diagonal(i, carry, p=p, q=q, bq=bq, dPp=dPp, dAp=dAp):
      dq, RA, dkc, E = carry
      t = SUB - 1 - i
      j = p * SUB + t
      E = _diagonal_decay(g_ref, j, t, E, sub_row)
      aP = jnp.sum(jnp.where(col_c == j, dPp, 0.0), axis=1)[:, None] * E   # dP_ij exp(G_i - G_j)
      aA = jnp.sum(jnp.where(col_c == j, dAp, 0.0), axis=1)[:, None] * E
      k_j = k_ref[j, :].astype(F32)[None, :]
      dq += aP * k_j
      RA += aA * k_j
      s = jnp.sum(aP * q + aA * bq, axis=0)[None, :]
      dkc += jnp.where(sub_row == t, s, 0.0)
      return dq, RA, dkc, E

    dq, RA, dkc, _ = lax.fori_loop(0, SUB, diagonal, (dq, RA, dkc, jnp.zeros((SUB, K), F32)))
    dk += bp[:, None] * RA + dkc
    dbeta += jnp.sum(kp * RA, axis=1)
    dG += q * dq + bq * RA - kp * dkc
    dq_ref[rows, :] = (dq1_ref[rows, :] + dq).astype(dq_ref.dtype)
    dk_ref[rows, :] = dk.astype(dk_ref.dtype)
    db_ref[rows] = dbeta
    dg_ref[rows, :] = dG


def _bwd_wy(q, k, v, G, beta, Tinv, do, vn, dw, du, dq1, dk1, dG1, st: Static):
  B, T, H, K = k.shape
  V = v.shape[-1]
  sp = Specs(H, CHUNK, T)
  kern = functools.partial(_bwd_wy_kernel, scale=st.scale, bv=min(st.cfg.bv_chunk, V))
  tok_k, tok_v = sp.chunk_tok(K), sp.chunk_tok(V)
  return launch(kern, (sp.NT, B * H),
               [tok_k, tok_k, tok_v, sp.chunk_gate(K), sp.chunk_gate(), sp.chunk_tok(CHUNK),
                tok_v, tok_v, tok_k, tok_v, tok_k, tok_k, tok_k],
               [tok_k, tok_k, tok_v, sp.chunk_gate(), tok_k],
               [sds(q.shape, q.dtype), sds(k.shape, k.dtype), sds(v.shape, v.dtype),
                sds(beta.shape, F32), sds(G.shape, F32)],
               st, st.cfg.warps_wy_channel_bwd, st.cfg.stages_chunk)(
                   q, k, v, G, beta, Tinv, do, vn, dw, du, dq1, dk1, dG1)


# --- custom_vjp on padded, chunk-aligned inputs ---------------------------------------------------

@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _chunk_kda(st: Static, q, k, v, g, beta, h0, starts, ends):
  """(o, final state) of padded inputs; g [B, T, H, K], beta [B, H, T] float32 (layout.run_chunked's
  `core`)."""
  return _chunk_kda_fwd(st, q, k, v, g, beta, h0, starts, ends)[0]


def _chunk_kda_fwd(st, q, k, v, g, beta, h0, starts, ends):
  G = chunk_cumsum(g, CHUNK, axis=1)
  w, u, Tinv, P = _wy_fwd(q, k, v, G, beta, st)
  o, ht = chunk_state.state_pass(q, k, w, u, G, h0, starts, ends, st, want_o=True, scores=P)
  return (o, ht), (q, k, v, G, beta, h0, w, u, Tinv, P, starts, ends)


def _chunk_kda_bwd(st, res, cts):
  q, k, v, G, beta, h0, w, u, Tinv, P, starts, ends = res
  do, dht = cts
  do = do.astype(q.dtype)
  h, vn = chunk_state.state_pass(None, k, w, u, G, h0, starts, ends, st, want_o=False)
  dh, dvn, dh0 = chunk_dh.dh_pass(q, k, w, do, G, dht.astype(F32), starts, ends, st, scores=P)
  dq, dk, dG, dw = chunk_dqk.dqk_pass(q, k, G, h, dh, do, vn, dvn, st, want_dw=True)
  dq, dk, dv, dbeta, dG = _bwd_wy(q, k, v, G, beta, Tinv, do, vn, dw, dvn, dq, dk, dG, st)
  dg = chunk_cumsum(dG, CHUNK, reverse=True, axis=1)
  return dq, dk, dv, dg, dbeta, dh0, None, None


_chunk_kda.defvjp(_chunk_kda_fwd, _chunk_kda_bwd)


def chunk_kda(q, k, v, g, beta, *, scale, initial_state, cu_seqlens=None, interpret=False,
              config: Config = DEFAULT):
  """q, k [B, T, H, K]; v [B, T, H, V]; g [B, T, H, K] (log decays); beta [B, T, H].

  Returns (o [B, T, H, V] in q.dtype, final_state [N, H, K, V] float32), like xla.py.
  """
  return run_chunked(_chunk_kda, q, k, v, (g, beta), scale=scale, initial_state=initial_state,
                     cu_seqlens=cu_seqlens, interpret=interpret, config=config)


def fused_recurrent_kda(q, k, v, g, beta, *, scale, initial_state, cu_seqlens=None,
                        interpret=False):
  """Token by token (decode): common/gpu/fused_recurrent.py with g [B, T, H, K]. Shapes as
  `chunk_kda`."""
  return fused_recurrent(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                         cu_seqlens=cu_seqlens, interpret=interpret,
                         reference=reference.fused_recurrent_kda)
