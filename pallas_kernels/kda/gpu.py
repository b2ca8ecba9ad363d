"""KDA as Pallas GPU kernels (Triton lowering), with its custom_vjp: the gated delta rule's WY/UT
kernels with a per-channel decay.

G is the chunk-local cumsum of g [C, K] (float32, token layout [B, T, H, K]), C = 64. Per-channel
decays do not factor out of the intra-chunk products, so both score matrices of a chunk,

  A_ij = beta_i sum_c k_ic k_jc exp(G_ic - G_jc)   (j < i: the WY/UT system (I + A) U = ...)
  P_ij = scale sum_c q_ic k_jc exp(G_ic - G_jc)    (j <= i: the output's intra-chunk scores)

are formed by levels (common/gpu/levels.py): at level s a pair j < i is split at its group's
reference row e, exp(G_i - G_e) exp(G_e - G_j), each row's operand one exp of its distance to e
(the levels run in a `fori_loop`, `over_levels`); the diagonal i = j has no decay. No exponent is
ever positive, so any gate magnitude is safe without a lower bound on g (fla's KDA needs one: its
issue #701), and every product is a tensor-core dot (no key-by-key loop over a sub-chunk's diagonal
block, no 3-D [i, j, channel] product). A level's pairs are the rows of its groups' upper halves
against those of their lower halves (`level_rows`), C/2 each: the forward takes them as one
[C/2, C/2] dot of the gathered rows, stored in place, on float32 operands (tf32 for 16-bit inputs,
as fla's intra-chunk dots); the backward as full-chunk [C, C] products of the score gradients
masked to the level's pairs (`pair_levels`), in the input dtype (its [C, C/2] products of gathered
halves ran slower: benchmarks/RESULTS.md, "KDA's score kernels").

forward
  0. `layout.gate_cumsum`     grid (NT, B*H): G.
  1. `_scores_fwd`            grid (NT, B*H), levels outside, key tiles of BK inside: A
                              (float32) and P (input dtype), and the gated qg = scale exp(G) q,
                              kg = exp(G_C - G) k the state passes read (their serial loops then
                              do no [C, K] exps); in one launch, or A with kg and P with qg in
                              two (`Config.split_scores_fwd`).
  2. `_wy_fwd`                grid (NT, B*H): A's 16 x 16 blocks from HBM, T = (I + A)^-1
                              (float32, by common/gpu/kernel_math's block inverse),
                              w = T (beta exp(G) k), u = T (beta v), in the input dtype.
  3. `chunk_state.state_pass` (per-channel gates, P given): v' = u - w S;  o = qg S + P v';
                              S = diag(exp(G_C)) S + kg^T v'.
backward (residuals: the inputs, w, u, T, P, qg and kg; the states are recomputed)
  4. `chunk_state.state_pass` the chunk-start states h and v'.
  5. `chunk_dh.dh_pass`       dh, dv' = P^T do + kg dh, d initial state (P^T do chunk-parallel
                              before it above K = 128).
  6. `chunk_dqk.dqk_pass`     the state parts of dq, dk and dG, and dw = -dv' h^T.
  7a. `_bwd_wy`               grid (NT, B*H): back through w, u and T: dv, dbeta's and dk's and
                              dG's parts, and the score gradients dA = -T^T dT T^T (strictly lower)
                              and dP = scale do v'^T (lower), in the input dtype.
  7b. `_bwd_scores`           grid (K/BK, NT, B*H): back through A and P by levels: the rest of dq,
                              dk, dbeta, and dg, the reverse chunk-local cumsum of dG.

Supported as the gated delta rule's kernels (common/gpu/layout.py's `run_chunked`): any B, T, H;
K up to 256 and any V (more value tiles in the same kernels); bf16, f16 and f32; initial / final
state and cu_seqlens.
`fused_recurrent_kda` is common/gpu/fused_recurrent.py's decode kernel with the per-channel gate.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from pallas_kernels.common.gpu import chunk_dh, chunk_dqk, chunk_state, config as shared_config
from pallas_kernels.common.gpu import layout
from pallas_kernels.common.gpu.config import CHUNK, Static
from pallas_kernels.common.gpu.fused_recurrent import fused_recurrent
from pallas_kernels.common.gpu.kernel_math import (F32, SUB, block_unit_lower_inverse, dot, dot_nt,
                                                   dot_tn, lower_mask, over_value_tiles, precision)
from pallas_kernels.common.gpu.layout import Specs, gate_cumsum, launch, run_chunked, sds
from pallas_kernels.common.gpu.levels import (diagonal, half_decays, level_decay, level_rows,
                                              one_group, over_levels, pair_levels,
                                              reference_rows)
from pallas_kernels.gated_delta_rule.gpu import back_through_u, write_inverse_product
from pallas_kernels.kda import reference

unsupported = layout.unsupported  # the dispatch `supports` hook: reason or None


class Config(NamedTuple):
  """Tile sizes and launch parameters: the shared stages' (`shared`) and KDA's own kernels'."""
  shared: shared_config.Config = shared_config.DEFAULT
  warps_wy: int = 4       # the per-channel-gate WY/UT kernels: forward
  warps_wy_bwd: int = 8   # and backward
  bk_scores: int = 64     # key tile of the score kernels (the gradient's grid axis). H100, anchor
                          # shape, one call, fwd+bwd ms: 5.230 at 32, 4.598 at 64, 5.381 at 128,
                          # 6.347 at 16; 8 warps against 4.673 at 4 (key tiles of 32)
  warps_scores: int = 8   # the score-gradient kernel
  warps_scores_fwd: int = 4  # the score kernel of the forward
  bk_scores_fwd: int | None = 64  # its key tile where it differs from bk_scores. H100, anchor
                                  # shape, one call, fwd / fwd+bwd ms: 1.682 / 5.538 at 32, 1.609
                                  # / 5.283 at 64; 4 warps against 1.717 / 5.404 at 2 and 1.800 /
                                  # 5.463 at 8
  stages_scores_fwd: int = 3  # and its pipeline stages (1.645 / 5.302 at two in that call)
  split_scores_fwd: bool = False  # A (with kg) and P (with qg) in two launches of the score
                                  # kernel, each program holding one [C/2, C/2] sum


DEFAULT = Config()

# --- 1. the scores by levels ----------------------------------------------------------------------

def _scores_fwd_kernel(q_ref, k_ref, g_ref, b_ref, a_ref, p_ref, qg_ref, kg_ref, *, scale, bk):
  """Level by level (`over_levels`), key tiles inside: the level's pairs as one [C/2, C/2] dot of
  gathered rows (`level_rows`), stored in place where both rows are in one group; the diagonal
  and above stored first (A's 0, P's undecayed scale q_i k_i). Each entry of A and P is written
  once. The scores whose refs are given: A with kg (q_ref, p_ref and qg_ref None), P with qg
  (b_ref, a_ref and kg_ref None), or both."""
  C, K = k_ref.shape
  dt = k_ref.dtype
  prec = precision(dt)
  n_tiles = K // bk
  tile = lambda i: pl.ds(pl.multiple_of(i * bk, bk), bk)
  want_a, want_p = a_ref is not None, p_ref is not None

  def gate_tile(i, qk):
    cols = tile(i)
    k, G = k_ref[:, cols], g_ref[:, cols]
    # the state passes' operands, gated once here: scale exp(G) q and exp(G_C - G) k
    if want_a:
      kg_ref[:, cols] = (k.astype(F32) * jnp.exp(g_ref[C - 1, cols][None, :] - G)).astype(dt)
    if not want_p:
      return qk
    q = q_ref[:, cols]
    qg_ref[:, cols] = (q.astype(F32) * (jnp.exp(G) * scale)).astype(dt)
    return qk + jnp.sum(q.astype(F32) * k.astype(F32), axis=1)

  qk = lax.fori_loop(0, n_tiles, gate_tile, jnp.zeros((C,), F32))
  on_and_above = ~lower_mask(C, strict=True)
  if want_a:
    plgpu.store(a_ref, jnp.zeros((C, C), F32), mask=on_and_above)
  if want_p:
    P_diag = jnp.where(diagonal(), (qk * scale)[:, None], 0.0)
    plgpu.store(p_ref, P_diag.astype(p_ref.dtype), mask=on_and_above)

  def level(s, carry):
    halves = upper, lower, _ = level_rows(s)

    def key_tile(i, acc):  # float32 operands: tf32 dots for 16-bit inputs, as fla's
      cols = tile(i)
      E_upper, E_lower = half_decays(g_ref, cols, halves)
      k_lower = k_ref[lower, cols].astype(F32) * E_lower
      side = lambda x_ref: x_ref[upper, cols].astype(F32) * E_upper  # noqa: E731
      out = (acc[0] + dot_nt(side(k_ref), k_lower, prec),) if want_a else ()
      return out + (acc[-1] + dot_nt(side(q_ref), k_lower, prec),) if want_p else out

    half = jnp.zeros((C // 2, C // 2), F32)
    sums = lax.fori_loop(0, n_tiles, key_tile, (half,) * (want_a + want_p))
    pairs, at = one_group(s, upper, lower), (upper[:, None], lower[None, :])
    if want_a:
      plgpu.store(a_ref.at[at], sums[0] * b_ref[upper][:, None], mask=pairs)
    if want_p:
      plgpu.store(p_ref.at[at], (sums[-1] * scale).astype(p_ref.dtype), mask=pairs)
    return carry

  over_levels(level, jnp.int32(0))


def _scores_fwd(q, k, G, beta, st: Static):
  """Returns A [B, T, H, C] (float32, strictly lower, beta in), P [B, T, H, C] (lower, the scale
  in) and the gated scale exp(G) q and exp(G_C - G) k [B, T, H, K] (input dtype): one launch, or
  two (`Config.split_scores_fwd`)."""
  B, T, H, K = k.shape
  sp = Specs(H, CHUNK, T)
  cfg = st.family_cfg
  bk = min(cfg.bk_scores if cfg.bk_scores_fwd is None else cfg.bk_scores_fwd, K)
  kern = functools.partial(_scores_fwd_kernel, scale=st.scale, bk=bk)
  tok_k, rows = sp.chunk_tok(K), sp.chunk_tok(CHUNK)
  in_specs = [tok_k, tok_k, sp.chunk_gate(K), sp.chunk_gate()]
  out_specs = [rows, rows, tok_k, tok_k]
  out_shape = [sds((B, T, H, CHUNK), F32), sds((B, T, H, CHUNK), k.dtype), sds(k.shape, k.dtype),
               sds(k.shape, k.dtype)]
  run = lambda outs, *args: launch(  # noqa: E731  (None for an input or output a launch omits)
      kern, (sp.NT, B * H), [None if x is None else spec for spec, x in zip(in_specs, args)],
      [x if i in outs else None for i, x in enumerate(out_specs)],
      [x if i in outs else None for i, x in enumerate(out_shape)], st, cfg.warps_scores_fwd,
      cfg.stages_scores_fwd)(*args)
  if not cfg.split_scores_fwd:
    return run((0, 1, 2, 3), q, k, G, beta)
  A, _, _, kg = run((0, 3), None, k, G, beta)
  _, P, qg, _ = run((1, 2), q, k, G, None)
  return A, P, qg, kg


# --- 2. the WY/UT transform -----------------------------------------------------------------------

def _wy_fwd_kernel(k_ref, v_ref, g_ref, b_ref, a_ref, w_ref, u_ref, t_ref, *, unrolled):
  n = CHUNK // SUB
  rows = [pl.ds(p * SUB, SUB) for p in range(n)]
  dt = k_ref.dtype
  prec = precision(dt)
  A = [[a_ref[rows[p], rows[q]] for q in range(p + 1)] for p in range(n)]
  T = block_unit_lower_inverse(A, prec)
  bs = [b_ref[r] for r in rows]
  kb = [(k_ref[r, :].astype(F32) * (bs[q][:, None] * jnp.exp(g_ref[r, :]))).astype(dt)
        for q, r in enumerate(rows)]
  zero = jnp.zeros((SUB, SUB), dt)
  Ts = [[T[p][q].astype(dt) for q in range(p + 1)] for p in range(n)]
  for p in range(n):
    for q in range(n):
      t_ref[rows[p], rows[q]] = Ts[p][q] if q <= p else zero
    w_ref[rows[p], :] = sum(dot(Ts[p][q], kb[q], prec) for q in range(p + 1)).astype(w_ref.dtype)
  write_inverse_product(Ts, bs, v_ref, u_ref, unrolled)


def _wy_fwd(k, v, G, beta, A, st: Static):
  """Returns w [B, T, H, K], u [B, T, H, V] and the chunk inverses T [B, T, H, C] (input dtype)."""
  B, T, H, K = k.shape
  V = v.shape[-1]
  sp = Specs(H, CHUNK, T)
  rows = sp.chunk_tok(CHUNK)
  kern = functools.partial(_wy_fwd_kernel, unrolled=st.cfg.unrolled_value_columns)
  return launch(kern, (sp.NT, B * H),
               [sp.chunk_tok(K), sp.chunk_tok(V), sp.chunk_gate(K), sp.chunk_gate(), rows],
               [sp.chunk_tok(K), sp.chunk_tok(V), rows],
               [sds(k.shape, k.dtype), sds(v.shape, k.dtype), sds((B, T, H, CHUNK), k.dtype)], st,
               st.family_cfg.warps_wy, st.cfg.stages_chunk)(k, v, G, beta, A)


# --- 7a. back through the WY/UT transform ---------------------------------------------------------

def _bwd_wy_kernel(k_ref, v_ref, g_ref, b_ref, t_ref, do_ref, vn_ref, dw_ref, du_ref, dk1_ref,
                   dg1_ref, dv_ref, db_ref, dk_ref, dg_ref, da_ref, dp_ref, *, scale, bv, unrolled):
  """w = T kb with kb = beta exp(G) k, u = T (beta v), T = (I + A)^-1 (the forward's, input
  dtype): dv, dbeta's and dk's and dG's parts through w and u (added to the state parts dk1, dg1,
  whose buffers the outputs reuse), and the score gradients for 7b in the input dtype (7b's dot
  operands): dA = -T^T dT T^T (strictly lower) and dP = scale do v'^T (lower)."""
  C = CHUNK
  Tc, beta = t_ref[...], b_ref[...]
  dt = Tc.dtype
  prec = precision(dt)
  dP = over_value_tiles(v_ref.shape[1], bv, unrolled,
                        lambda vs, dP: dP + dot_nt(do_ref[:, vs], vn_ref[:, vs], prec),
                        jnp.zeros((C, C), F32))
  dp_ref[...] = jnp.where(lower_mask(C), dP * scale, 0.0).astype(dp_ref.dtype)
  dT, dbeta = back_through_u(Tc, beta, v_ref, du_ref, dv_ref, bv, unrolled)
  ke = k_ref[...].astype(F32) * jnp.exp(g_ref[...])
  kb = ke * beta[:, None]
  dw = dw_ref[...]
  dT += dot_nt(dw, kb.astype(dt), prec)
  dkb = dot_tn(Tc, dw, prec)                          # T^T dw
  db_ref[...] = dbeta + jnp.sum(dkb * ke, axis=1)
  dg_ref[...] = dg1_ref[...] + dkb * kb
  # exp(G) again rather than held beside the other [C, K] operands (fewer registers)
  dk_ref[...] = dk1_ref[...] + dkb * (beta[:, None] * jnp.exp(g_ref[...]))
  dA = -dot_nt(dot_tn(Tc, dT.astype(dt), prec).astype(dt), Tc, prec)  # -T^T dT T^T
  da_ref[...] = jnp.where(lower_mask(C, strict=True), dA, 0.0).astype(da_ref.dtype)


def _bwd_wy(k, v, G, beta, Tinv, do, vn, dw, du, dk1, dG1, st: Static):
  """Returns dv (input dtype), dbeta's WY part [B, H, T], dk and dG with their WY parts added (in
  dk1's and dG1's buffers, float32) and the score gradients dA, dP [B, T, H, C] (input dtype)."""
  B, T, H, K = k.shape
  V = v.shape[-1]
  sp = Specs(H, CHUNK, T)
  kern = functools.partial(_bwd_wy_kernel, scale=st.scale, bv=min(st.cfg.bv_chunk, V),
                           unrolled=st.cfg.unrolled_value_columns)
  tok_k, tok_v, rows = sp.chunk_tok(K), sp.chunk_tok(V), sp.chunk_tok(CHUNK)
  scores = sds((B, T, H, CHUNK), k.dtype)
  return launch(kern, (sp.NT, B * H),
               [tok_k, tok_v, sp.chunk_gate(K), sp.chunk_gate(), rows, tok_v, tok_v, tok_k, tok_v,
                tok_k, tok_k],
               [tok_v, sp.chunk_gate(), tok_k, tok_k, rows, rows],
               [sds(v.shape, v.dtype), sds(beta.shape, F32), sds(k.shape, F32), sds(G.shape, F32),
                scores, scores],
               st, st.family_cfg.warps_wy_bwd, st.cfg.stages_chunk, aliases={9: 2, 10: 3})(
                   k, v, G, beta, Tinv, do, vn, dw, du, dk1, dG1)


# --- 7b. back through the scores by levels --------------------------------------------------------

def _bwd_scores_kernel(q_ref, k_ref, g_ref, b_ref, da_ref, dp_ref, dq1_ref, dkw_ref, dgw_ref,
                       dq_ref, dk_ref, dg_ref, db_ref):
  """One chunk and key tile. A score matrix M_ij = sum_c a_ic b_jc exp(G_ic - G_jc) (P: a = q with
  the scale in dP; A: a = beta k; b = k for both) sends its gradient dM to the row side
  sum_j dM_ij b_j exp(G_i - G_j) (dq; RA, A's, which gives dk and dbeta) and to the column side
  sum_i dM_ij a_i exp(G_i - G_j) (dk), by the forward's levels: at level s, with E its
  `level_decay`, the row side E * (dM_s (b E)) and the column side E * (dM_s^T (a E)), dM_s
  masked to the level's pairs; the diagonal without decay. Exact per channel, so dq and dk are
  final, and dg, the reverse chunk-local cumsum of dG, is taken here; dbeta is this tile's part."""
  dt = q_ref.dtype
  prec = precision(dt)
  q, k, G, beta = q_ref[...], k_ref[...], g_ref[...], b_ref[...]
  dP, dA = dp_ref[...], da_ref[...]
  dP_diag = jnp.where(diagonal(), dP, 0)
  levels = pair_levels()

  def level(s, acc):
    dq, RA, dkc = acc
    E, _ = level_decay(G, reference_rows(g_ref, slice(None), s), s)
    kE = k.astype(F32) * E
    qE, bkE, kE = (q.astype(F32) * E).astype(dt), (kE * beta[:, None]).astype(dt), kE.astype(dt)
    pairs = levels == s
    dPs, dAs = jnp.where(pairs, dP, 0), jnp.where(pairs, dA, 0)
    return (dq + E * dot(dPs, kE, prec), RA + E * dot(dAs, kE, prec),
            dkc + E * (dot_tn(dPs, qE, prec) + dot_tn(dAs, bkE, prec)))

  dq, RA, dkc = over_levels(level, (dot(dP_diag, k, prec), jnp.zeros(q.shape, F32),
                                     dot_tn(dP_diag, q, prec)))
  qf, kf = q_ref[...].astype(F32), k_ref[...].astype(F32)
  dq_ref[...] = (dq1_ref[...] + dq).astype(dq_ref.dtype)
  dk_ref[...] = (dkw_ref[...] + beta[:, None] * RA + dkc).astype(dk_ref.dtype)
  db_ref[...] = jnp.sum(kf * RA, axis=1)
  dG = dgw_ref[...] + qf * dq + (kf * beta[:, None]) * RA - kf * dkc
  dg_ref[...] = jnp.sum(dG, axis=0)[None, :] - jnp.cumsum(dG, axis=0) + dG


def _bwd_scores(q, k, G, beta, dA, dP, dq1, dkw, dGw, st: Static):
  """Returns dq, dk (input dtype), dg [B, T, H, K] (the gradient of the raw gate) and dbeta's score
  part [B, H, T] (float32)."""
  B, T, H, K = q.shape
  BK = min(st.family_cfg.bk_scores, K)
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
                          st, st.family_cfg.warps_scores, st.cfg.stages_chunk)(
                              q, k, G, beta, dA, dP, dq1, dkw, dGw)
  return dq, dk, dG, jnp.sum(db, axis=0)


# --- custom_vjp on padded, chunk-aligned inputs ---------------------------------------------------

@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _chunk_kda(st: Static, q, k, v, g, beta, h0, starts, ends):
  """(o, final state) of padded inputs; g [B, T, H, K], beta [B, H, T] float32 (layout.run_chunked's
  `core`)."""
  return _chunk_kda_fwd(st, q, k, v, g, beta, h0, starts, ends)[0]


def _chunk_kda_fwd(st, q, k, v, g, beta, h0, starts, ends):
  G = gate_cumsum(g, st)
  A, P, qg, kg = _scores_fwd(q, k, G, beta, st)
  w, u, Tinv = _wy_fwd(k, v, G, beta, A, st)
  o, ht, kept = chunk_state.state_pass(qg, kg, w, u, G, h0, starts, ends, st, want_o=True,
                                       scores=P, keep_h=st.cfg.keep_states)
  return (o, ht), (q, k, v, G, beta, h0, w, u, Tinv, P, qg, kg, kept, starts, ends)


def _chunk_kda_bwd(st, res, cts):
  q, k, v, G, beta, h0, w, u, Tinv, P, qg, kg, kept, starts, ends = res
  do, dht = cts
  do = do.astype(q.dtype)
  h, vn = kept or chunk_state.state_pass(None, kg, w, u, G, h0, starts, ends, st, want_o=False)
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
                     cu_seqlens=cu_seqlens, interpret=interpret, config=config.shared,
                     family_config=config)


def fused_recurrent_kda(q, k, v, g, beta, *, scale, initial_state, cu_seqlens=None,
                        interpret=False):
  """Token by token (decode): common/gpu/fused_recurrent.py with g [B, T, H, K]. Shapes as
  `chunk_kda`."""
  return fused_recurrent(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                         cu_seqlens=cu_seqlens, interpret=interpret,
                         reference=reference.fused_recurrent_kda)
