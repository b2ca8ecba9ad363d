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
                              u = T (beta v), and the gated qg = scale exp(G) q, kg = exp(G_C - G) k
                              the state passes read (their serial loops then do no [C, K] exps);
                              all in the input dtype.
  2. `chunk_state.state_pass` (per-channel gates, P given): v' = u - w S;  o = qg S + P v';
                              S = diag(exp(G_C)) S + kg^T v'.
backward (residuals: the inputs, w, u, T, P, qg and kg; the states are recomputed)
  3. `chunk_state.state_pass` the chunk-start states h and v'.
  4. `chunk_dh.dh_pass`       dh, dv' = P^T do + kg dh, d initial_state.
  5. `chunk_dqk.dqk_pass`     the state parts of dq, dk and dG, and dw = -dv' h^T.
  6a. `_bwd_wy`               grid (NT, B*H): back through w, u and T: dv, dbeta's and dk's and
                              dG's parts, and the score gradients dA = -T^T dT T^T (strictly lower)
                              and dP = scale do v'^T (lower), float32 in HBM.
  6b. `_bwd_scores`           grid (K/16, NT, B*H): back through A and P by sub-chunks (their row
                              and column blocks read from refs): the rest of dq, dk, dbeta, and dg,
                              the reverse chunk-local cumsum of dG.

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
                                                   dot_tn, iota, lower_mask, precision)
from pallas_kernels.common.gpu.layout import Specs, chunk_cumsum, launch, run_chunked, sds
from pallas_kernels.gated_delta_rule.gpu import back_through_u
from pallas_kernels.kda import reference

# Opt-in (`backend="gpu"`) until this form of the kernels has been compiled and timed on a GPU:
# interpret mode proves it correct, not that it compiles quickly or beats the xla path there
# (benchmarks/NOTES.md). common/dispatch.py reads it.
AUTO = False

unsupported = layout.unsupported  # the dispatch `supports` hook: reason or None

_NEG = -jnp.inf


def _masked_exp(mask, x):
  """exp(x) where mask, else 0, masked before the exp (x may be positive off the mask)."""
  return jnp.exp(jnp.where(mask, x, _NEG))


def _diagonal_decays(G):
  """exp(G_i - G_j) [16, 16, D] (i, j, channel) of a 16-row block's gates G [16, D], zero for j > i
  (masked before the exp): the diagonal block of the scores, all pairs at once."""
  causal = (iota((SUB, SUB), 0) >= iota((SUB, SUB), 1))[:, :, None]
  return _masked_exp(causal, G[:, None, :] - G[None, :, :])


# --- 1. the sub-chunk scores and the WY/UT transform ----------------------------------------------

def _wy_fwd_kernel(q_ref, k_ref, v_ref, g_ref, b_ref, w_ref, u_ref, t_ref, p_ref, qg_ref, kg_ref, *,
                   scale):
  C, K = k_ref.shape
  n = C // SUB
  rows = [pl.ds(p * SUB, SUB) for p in range(n)]
  dt = k_ref.dtype
  prec = precision(dt)
  ks = [k_ref[r, :] for r in rows]
  Gs = [g_ref[r, :] for r in rows]
  bs = [b_ref[r] for r in rows]
  A = [[None] * n for _ in range(n)]
  P = [[None] * n for _ in range(n)]
  g_end = g_ref[C - 1, :][None, :]
  for p in range(n):
    # the state passes' operands, gated once here: scale exp(G) q and exp(G_C - G) k
    qg_ref[rows[p], :] = (q_ref[rows[p], :].astype(F32) * (jnp.exp(Gs[p]) * scale)).astype(dt)
    kg_ref[rows[p], :] = (ks[p].astype(F32) * jnp.exp(g_end - Gs[p])).astype(dt)
    if p:  # the keys of blocks q < p, both sides relative to the block's first row r
      g_r = g_ref[p * SUB, :][None, :]
      e_p = jnp.exp(Gs[p] - g_r)
      qa = (q_ref[rows[p], :].astype(F32) * e_p).astype(dt)
      ka = (ks[p].astype(F32) * e_p).astype(dt)
      for q in range(p):
        kb = (ks[q].astype(F32) * jnp.exp(g_r - Gs[q])).astype(dt)
        A[p][q] = dot_nt(ka, kb, prec) * bs[p][:, None]
        P[p][q] = dot_nt(qa, kb, prec) * scale
    # the diagonal block, 16 key channels at a time: [16, 16, 16] products summed over channels
    # (a loop, not unrolled: one copy of the 3-D code per block keeps the Triton compile short)
    def diagonal(c, carry, rows=rows[p]):
      Ad, Pd = carry
      cs = pl.ds(pl.multiple_of(c * SUB, SUB), SUB)
      kc, qc = k_ref[rows, cs].astype(F32), q_ref[rows, cs].astype(F32)
      kE = kc[None, :, :] * _diagonal_decays(g_ref[rows, cs])
      return (Ad + jnp.sum(kc[:, None, :] * kE, axis=2), Pd + jnp.sum(qc[:, None, :] * kE, axis=2))

    zero = jnp.zeros((SUB, SUB), F32)
    Ad, Pd = lax.fori_loop(0, K // SUB, diagonal, (zero, zero))
    A[p][p] = jnp.where(lower_mask(SUB, strict=True), Ad, 0.0) * bs[p][:, None]
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
  """Returns w [B, T, H, K], u [B, T, H, V], the chunk inverses T and the scores P [B, T, H, C],
  and the gated scale exp(G) q and exp(G_C - G) k [B, T, H, K] (all in the input dtype)."""
  B, T, H, K = k.shape
  V = v.shape[-1]
  sp = Specs(H, CHUNK, T)
  kern = functools.partial(_wy_fwd_kernel, scale=st.scale)
  chunk_rows = sds((B, T, H, CHUNK), k.dtype)
  return launch(kern, (sp.NT, B * H),
               [sp.chunk_tok(K), sp.chunk_tok(K), sp.chunk_tok(V), sp.chunk_gate(K), sp.chunk_gate()],
               [sp.chunk_tok(K), sp.chunk_tok(V), sp.chunk_tok(CHUNK), sp.chunk_tok(CHUNK),
                sp.chunk_tok(K), sp.chunk_tok(K)],
               [sds(k.shape, k.dtype), sds(v.shape, k.dtype), chunk_rows, chunk_rows,
                sds(k.shape, k.dtype), sds(k.shape, k.dtype)], st,
               st.cfg.warps_wy_channel, st.cfg.stages_chunk)(q, k, v, G, beta)


# --- 6a. back through the WY/UT transform ---------------------------------------------------------

def _bwd_wy_kernel(k_ref, v_ref, g_ref, b_ref, t_ref, do_ref, vn_ref, dw_ref, du_ref, dk1_ref,
                   dg1_ref, dv_ref, db_ref, dk_ref, dg_ref, da_ref, dp_ref, *, scale, bv):
  """w = T kb with kb = beta exp(G) k, u = T (beta v), T = (I + A)^-1 (the forward's, input
  dtype): dv, dbeta's and dk's and dG's parts through w and u (added to the state parts dk1, dg1,
  whose buffers the outputs reuse), and the score gradients for 6b, float32: dA = -T^T dT T^T
  (strictly lower) and dP = scale do v'^T (lower)."""
  C = CHUNK
  k, G, beta, Tc = k_ref[...], g_ref[...], b_ref[...], t_ref[...]
  dt = k.dtype
  prec = precision(dt)
  dT, dbeta = back_through_u(Tc, beta, v_ref, du_ref, dv_ref, bv)
  dP = jnp.zeros((C, C), F32)
  for j in range(v_ref.shape[1] // bv):
    vs = pl.ds(j * bv, bv)
    dP += dot_nt(do_ref[:, vs], vn_ref[:, vs], prec)
  e_G = jnp.exp(G)
  kb = k.astype(F32) * (beta[:, None] * e_G)
  dw = dw_ref[...]
  dkb = dot_tn(Tc, dw, prec)                          # T^T dw
  dT += dot_nt(dw, kb.astype(dt), prec)
  dA = -dot_nt(dot_tn(Tc, dT.astype(dt), prec).astype(dt), Tc, prec)  # -T^T dT T^T
  da_ref[...] = jnp.where(lower_mask(C, strict=True), dA, 0.0)
  dp_ref[...] = jnp.where(lower_mask(C), dP * scale, 0.0)
  db_ref[...] = dbeta + jnp.sum(dkb * k.astype(F32) * e_G, axis=1)
  dk_ref[...] = dk1_ref[...] + dkb * (beta[:, None] * e_G)
  dg_ref[...] = dg1_ref[...] + dkb * kb


def _bwd_wy(k, v, G, beta, Tinv, do, vn, dw, du, dk1, dG1, st: Static):
  """Returns dv (input dtype), dbeta's WY part [B, H, T], dk and dG with their WY parts added (in
  dk1's and dG1's buffers, float32) and the score gradients dA, dP [B, T, H, C] (float32)."""
  B, T, H, K = k.shape
  V = v.shape[-1]
  sp = Specs(H, CHUNK, T)
  kern = functools.partial(_bwd_wy_kernel, scale=st.scale, bv=min(st.cfg.bv_chunk, V))
  tok_k, tok_v, rows = sp.chunk_tok(K), sp.chunk_tok(V), sp.chunk_tok(CHUNK)
  scores = sds((B, T, H, CHUNK), F32)
  return launch(kern, (sp.NT, B * H),
               [tok_k, tok_v, sp.chunk_gate(K), sp.chunk_gate(), rows, tok_v, tok_v, tok_k, tok_v,
                tok_k, tok_k],
               [tok_v, sp.chunk_gate(), tok_k, tok_k, rows, rows],
               [sds(v.shape, v.dtype), sds(beta.shape, F32), sds(k.shape, F32), sds(G.shape, F32),
                scores, scores],
               st, st.cfg.warps_wy_channel_bwd, st.cfg.stages_chunk, aliases={9: 2, 10: 3})(
                   k, v, G, beta, Tinv, do, vn, dw, du, dk1, dG1)


# --- 6b. back through the sub-chunk scores ---------------------------------------------------------

def _bwd_scores_kernel(q_ref, k_ref, g_ref, b_ref, da_ref, dp_ref, dq1_ref, dkw_ref, dgw_ref,
                       dq_ref, dk_ref, dg_ref, db_ref):
  """One chunk and key tile. A score matrix M_ij = sum_c a_ic b_jc exp(G_ic - G_jc) (P: a = q with
  the scale in dP; A: a = beta k; b = k for both) sends its gradient dM to the row side
  sum_j dM_ij b_j exp(G_i - G_j) (dq; RA, A's, which gives dk and dbeta) and to the column side
  sum_i dM_ij a_i exp(G_i - G_j) (dk), in the forward's factorisation: per 16-row block, the
  earlier (later) blocks through dots relative to its first (last) row, the diagonal block as
  [16, 16, BK] products. Exact per channel, so dq and dk are final, and dg, the reverse chunk-local
  cumsum of dG (the blocks go last to first, `later_dG` carrying the sum of the blocks after); dbeta
  is this tile's part."""
  C, BK = k_ref.shape
  n = C // SUB
  dt = q_ref.dtype
  prec = precision(dt)
  tok_row = iota((C, BK), 0)

  def block(i, later_dG):
    """Block p = n - 1 - i; its first block's row side and its last's column side are all masked
    (zeros), so one loop body serves every block (one copy of the code: a short Triton compile)."""
    r0 = pl.multiple_of((n - 1 - i) * SUB, SUB)
    r1 = r0 + SUB - 1
    rows = pl.ds(r0, SUB)
    q, kp, Gp, bp = q_ref[rows, :].astype(F32), k_ref[rows, :].astype(F32), g_ref[rows, :], b_ref[rows]
    bq = kp * bp[:, None]
    # row side, the keys of earlier blocks relative to the first row r0
    g_r = g_ref[r0, :][None, :]
    kr = (k_ref[...].astype(F32) * _masked_exp(tok_row < r0, g_r - g_ref[...])).astype(dt)
    e_p = jnp.exp(Gp - g_r)
    dq = dot(dp_ref[rows, :].astype(dt), kr, prec) * e_p
    RA = dot(da_ref[rows, :].astype(dt), kr, prec) * e_p
    # column side, the queries of later blocks relative to the last row r1
    g_e = g_ref[r1, :][None, :]
    after = _masked_exp(tok_row > r1, g_ref[...] - g_e)
    qa = (q_ref[...].astype(F32) * after).astype(dt)
    ba = (k_ref[...].astype(F32) * (after * b_ref[...][:, None])).astype(dt)
    dkc = (dot_tn(dp_ref[:, rows].astype(dt), qa, prec)
           + dot_tn(da_ref[:, rows].astype(dt), ba, prec)) * jnp.exp(g_e - Gp)
    # the diagonal block
    E = _diagonal_decays(Gp)                             # [i, j, channel]
    XP = dp_ref[rows, rows][:, :, None] * E              # dP_ij exp(G_i - G_j)
    XA = da_ref[rows, rows][:, :, None] * E
    dq += jnp.sum(XP * kp[None, :, :], axis=1)
    RA += jnp.sum(XA * kp[None, :, :], axis=1)
    dkc += jnp.sum(XP * q[:, None, :] + XA * bq[:, None, :], axis=0)
    dq_ref[rows, :] = (dq1_ref[rows, :] + dq).astype(dq_ref.dtype)
    dk_ref[rows, :] = (dkw_ref[rows, :] + bp[:, None] * RA + dkc).astype(dk_ref.dtype)
    db_ref[rows] = jnp.sum(kp * RA, axis=1)
    dG = dgw_ref[rows, :] + q * dq + bq * RA - kp * dkc
    total = jnp.sum(dG, axis=0)[None, :]
    dg_ref[rows, :] = later_dG + total - jnp.cumsum(dG, axis=0) + dG
    return later_dG + total

  lax.fori_loop(0, n, block, jnp.zeros((1, BK), F32))


def _bwd_scores(q, k, G, beta, dA, dP, dq1, dkw, dGw, st: Static):
  """Returns dq, dk (input dtype), dg [B, T, H, K] (the gradient of the raw gate) and dbeta's score
  part [B, H, T] (float32)."""
  B, T, H, K = q.shape
  BK = min(st.cfg.bk_scores, K)
  NK = K // BK
  C = CHUNK
  tile = pl.BlockSpec((None, C, None, BK), lambda ik, n, bh: (bh // H, n, bh % H, ik))
  rows = pl.BlockSpec((None, C, None, C), lambda ik, n, bh: (bh // H, n, bh % H, 0))
  gate = pl.BlockSpec((None, None, C), lambda ik, n, bh: (bh // H, bh % H, n))
  dgate = pl.BlockSpec((None, None, None, C), lambda ik, n, bh: (ik, bh // H, bh % H, n))
  dq, dk, dG, db = launch(_bwd_scores_kernel, (NK, T // C, B * H),
                          [tile, tile, tile, gate, rows, rows, tile, tile, tile],
                          [tile, tile, tile, dgate],
                          [sds(q.shape, q.dtype), sds(k.shape, k.dtype), sds(G.shape, F32),
                           sds((NK, *beta.shape), F32)],
                          st, st.cfg.warps_scores, st.cfg.stages_chunk)(
                              q, k, G, beta, dA, dP, dq1, dkw, dGw)
  return dq, dk, dG, jnp.sum(db, axis=0)


# --- custom_vjp on padded, chunk-aligned inputs ---------------------------------------------------

@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _chunk_kda(st: Static, q, k, v, g, beta, h0, starts, ends):
  """(o, final state) of padded inputs; g [B, T, H, K], beta [B, H, T] float32 (layout.run_chunked's
  `core`)."""
  return _chunk_kda_fwd(st, q, k, v, g, beta, h0, starts, ends)[0]


def _chunk_kda_fwd(st, q, k, v, g, beta, h0, starts, ends):
  G = chunk_cumsum(g, CHUNK, axis=1)
  w, u, Tinv, P, qg, kg = _wy_fwd(q, k, v, G, beta, st)
  o, ht = chunk_state.state_pass(qg, kg, w, u, G, h0, starts, ends, st, want_o=True, scores=P)
  return (o, ht), (q, k, v, G, beta, h0, w, u, Tinv, P, qg, kg, starts, ends)


def _chunk_kda_bwd(st, res, cts):
  q, k, v, G, beta, h0, w, u, Tinv, P, qg, kg, starts, ends = res
  do, dht = cts
  do = do.astype(q.dtype)
  h, vn = chunk_state.state_pass(None, kg, w, u, G, h0, starts, ends, st, want_o=False)
  dh, dvn, dh0 = chunk_dh.dh_pass(qg, kg, w, do, G, dht.astype(F32), starts, ends, st, scores=P)
  dq, dk, dG, dw = chunk_dqk.dqk_pass(q, k, G, h, dh, do, vn, dvn, st, want_dw=True)
  dv, dbeta, dk, dG, dA, dP = _bwd_wy(k, v, G, beta, Tinv, do, vn, dw, dvn, dk, dG, st)
  dq, dk, dg, dbeta_scores = _bwd_scores(q, k, G, beta, dA, dP, dq, dk, dG, st)
  dbeta = dbeta + dbeta_scores
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
