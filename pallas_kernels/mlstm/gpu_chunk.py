"""The chunked mLSTM's Pallas GPU kernels (Triton lowering) and their launchers; gpu.py composes
them under its custom_vjp (its docstring has the math and the passes):

- `forward_pass` grid (V / BV, B*H): the forward state pass with the output (and, when
                 differentiated, the residual stores);
- `dstate_pass`  grid (V / BV, B*H), chunks in reverse: the state cotangents (dC, dn) per chunk;
- `dchunk_pass`  grid (NT, B*H): dq, dk, dv and the chunk-local di, db, dm0.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from pallas_kernels.common.gpu.config import CHUNK, Static  # (scale, is_varlen, interpret, cfg)
from pallas_kernels.common.gpu.kernel_math import (F32, dot, dot_nt, dot_tn, iota, precision,
                                                   state_at_flag, store_at_flag)
from pallas_kernels.common.gpu.layout import launch, sds, spec_if
from pallas_kernels.mlstm import reference
from pallas_kernels.mlstm.reference import EPS

MW = 16  # m is kept as a row of MW equal lanes in HBM (Triton loads and stores blocks, not scalars)


def max_weight(a, b):
  """d max(a, b) / da as jax assigns it: 1 where a > b, 1/2 on ties, else 0."""
  return jnp.where(a > b, 1.0, jnp.where(a == b, 0.5, 0.0))


# --- in-kernel chunk math ------------------------------------------------------------------------

class _Chunk(NamedTuple):
  causal: jnp.ndarray   # [C, C] s <= t
  L: jnp.ndarray        # [C, C] D_ts + i_s, -inf above the diagonal
  mrow: jnp.ndarray     # [C] max_s L_ts
  x: jnp.ndarray        # [C] b_t + m0
  m: jnp.ndarray        # [C] the stabilizer m_t
  sx: jnp.ndarray       # [C] exp(x_t - m_t)
  E: jnp.ndarray        # [C, C] exp(L - m_t)
  w: jnp.ndarray        # [C] exp(L_{C-1,s} - m')
  m_end: jnp.ndarray    # () m' = m_{C-1}
  decay: jnp.ndarray    # () exp(x_{C-1} - m')


def _last(x, axis=0):
  """Entry C - 1 of x along `axis` (a masked sum: Triton has no indexing of values)."""
  return jnp.sum(jnp.where(iota(x.shape, axis) == x.shape[axis] - 1, x, 0.0), axis=axis)


def _chunk(bh, bl, ig, m0) -> _Chunk:
  """bh + bl: the chunk-local inclusive cumsum b of log f (`_chunk_cumsum_hi_lo`), ig: [C] float32
  rows; m0 a scalar or a row [C] (the chunk-start m)."""
  C = bh.shape[0]
  t, s = iota((C, C), 0), iota((C, C), 1)
  causal = s <= t
  D = (bh[:, None] - bh[None, :]) + (bl[:, None] - bl[None, :])  # sum_{s < r <= t} log f_r
  L = jnp.where(causal, D + ig[None, :], -jnp.inf)
  mrow = jnp.max(L, axis=1)
  x = (bh + bl) + m0
  m = jnp.maximum(x, mrow)
  m_end = _last(m)
  # Each exponent differences the large terms first (m, i and m0 reach 1e4 at extreme input gates,
  # where float32 keeps ~1e-3) and adds the small log-forget sums after: exp(L - m) and exp(x - m)
  # as written would round those sums away.
  E = jnp.where(causal, jnp.exp((ig[None, :] - m[:, None]) + D), 0.0)
  w = jnp.exp((ig - m_end) + _last(D))
  sx = jnp.exp(((m0 - m) + bh) + bl)
  decay = jnp.exp(_last(((m0 - m_end) + bh) + bl))
  return _Chunk(causal, L, mrow, x, m, sx, E, w, m_end, decay)


# --- forward state pass with the output ----------------------------------------------------------

def _forward_kernel(q_ref, k_ref, v_ref, bh_ref, bl_ref, i_ref, C0_ref, n0_ref, m0_ref, starts_ref,
                    ends_ref, o_ref, Cf_ref, nf_ref, mf_ref, h_ref, nh_ref, m0t_ref, mt_ref,
                    den_ref, *, NT, scale):
  """The forward chunk loop. Absent refs are None: the varlen flags (starts_ref, ends_ref), and the
  residual stores (h_ref to den_ref) of a forward that is not differentiated."""
  is_varlen = starts_ref is not None
  save = h_ref is not None
  C = CHUNK
  dt = q_ref.dtype
  prec = precision(dt)

  def body(c, state):
    if is_varlen:
      state = state_at_flag(starts_ref[c], lambda j: (C0_ref[j].astype(F32), n0_ref[j].astype(F32),
                                                      jnp.max(m0_ref[j])), state)
    S, n, m = state
    t0 = pl.multiple_of(c * C, C)
    sl = pl.ds(t0, C)
    if save:
      h_ref[c] = S.astype(h_ref.dtype)
      nh_ref[c] = n
      m0t_ref[sl] = jnp.zeros((C,), F32) + m
    q, k, v = q_ref[sl, :], k_ref[sl, :], v_ref[sl, :]
    ch = _chunk(bh_ref[sl], bl_ref[sl], i_ref[sl], m)
    P = dot_nt(q, k, prec) * (ch.E * scale)
    qt = q.astype(F32) * (scale * ch.sx)[:, None]
    num = dot(qt.astype(dt), S.astype(dt), prec) + dot(P.astype(dt), v, prec)
    den = jnp.sum(qt * n[None, :], axis=1) + jnp.sum(P, axis=1)
    Z = jnp.maximum(jnp.abs(den), reference.normalizer_floor(ch.m)) + EPS
    o_ref[sl, :] = (num / Z[:, None]).astype(o_ref.dtype)
    if save:
      mt_ref[sl], den_ref[sl] = ch.m, den
    kw = k.astype(F32) * ch.w[:, None]
    S = ch.decay * S + dot_tn(kw.astype(dt), v, prec)
    n = ch.decay * n + jnp.sum(kw, axis=0)
    m = ch.m_end
    if is_varlen:
      store_at_flag(ends_ref[c], functools.partial(_store_state, (Cf_ref, nf_ref, mf_ref),
                                                   (S, n, jnp.zeros((MW,), F32) + m)))
    return S, n, m

  if is_varlen:
    state = (jnp.zeros(Cf_ref.shape[-2:], F32), jnp.zeros(nf_ref.shape[-1:], F32),
             jnp.zeros((), F32))
  else:
    state = (C0_ref[...].astype(F32), n0_ref[...].astype(F32), jnp.max(m0_ref[...]))
  S, n, m = lax.fori_loop(0, NT, body, state)
  if not is_varlen:
    Cf_ref[...], nf_ref[...], mf_ref[...] = S, n, jnp.zeros((MW,), F32) + m


def _store_state(refs, values, i):
  """refs[...][i] = values: a `store_at_flag` store of a state given as several arrays."""
  for r, x in zip(refs, values):
    r[i] = x


class _Specs:
  """BlockSpecs of the state passes: grid (iv, bh), iv the value tile (varied fastest: the programs
  of one head run side by side and share its keys through L2); blocks span the padded time axis.
  Outputs that do not depend on the value tile (n, m, per-token rows) get a leading tile axis so
  that every program writes its own block; the caller keeps tile 0's."""

  def __init__(self, H, T, K, BV, N_state):
    self.H, self.T, self.NT, self.K, self.BV, self.N = H, T, T // CHUNK, K, BV, N_state

  def tok(self, D, tiled):
    H, T = self.H, self.T
    return pl.BlockSpec((None, T, None, D), lambda iv, bh: (bh // H, 0, bh % H, iv if tiled else 0))

  def row(self, per_tile=False):   # [B, H, T] rows, or [NV, B, H, T]
    H, T = self.H, self.T
    if per_tile:
      return pl.BlockSpec((None, None, None, T), lambda iv, bh: (iv, bh // H, bh % H, 0))
    return pl.BlockSpec((None, None, T), lambda iv, bh: (bh // H, bh % H, 0))

  def chunk_C(self):               # [B, NT, H, K, V]
    H = self.H
    return pl.BlockSpec((None, self.NT, None, self.K, self.BV),
                        lambda iv, bh: (bh // H, 0, bh % H, 0, iv))

  def chunk_n(self):               # [NV, B, NT, H, K]
    H = self.H
    return pl.BlockSpec((None, None, self.NT, None, self.K),
                        lambda iv, bh: (iv, bh // H, 0, bh % H, 0))

  def state(self, D, tiled, per_tile=False):
    """[N, H, D...] (or [NV, N, H, D] per_tile) states: one per program (batch row bh // H), or
    all N of them (varlen, B == 1). tiled: D is (K, BV), block iv of the last axis."""
    H, N = self.H, self.N
    lead = (None,) if per_tile else ()
    lead_ix = (lambda iv: (iv,)) if per_tile else (lambda iv: ())
    shape = (self.K, self.BV) if tiled else (D,)
    tail = (lambda iv: (0, iv)) if tiled else (lambda iv: (0,))
    if N is None:
      return pl.BlockSpec(lead + (None, None) + shape,
                          lambda iv, bh: lead_ix(iv) + (bh // H, bh % H) + tail(iv))
    return pl.BlockSpec(lead + (N, None) + shape,
                        lambda iv, bh: lead_ix(iv) + (0, bh % H) + tail(iv))

  def flags(self):
    return pl.BlockSpec((self.NT,), lambda iv, bh: (0,))


def forward_pass(st: Static, q, k, v, bh, bl, ig, C0, n0, m0, starts, ends, save: bool):
  """Padded inputs; bh + bl the chunk-local cumsum of log f, ig: [B, H, T] float32;
  C0 [N, H, K, V], n0 [N, H, K], m0 [N, H] float32. Returns o, (C, n, m) and, with save,
  (h [B, NT, H, K, V], n at chunk starts [B, NT, H, K], m0 per token [B, H, T], m_t [B, H, T],
  den [B, H, T])."""
  B, T, H, K = q.shape
  V, N = v.shape[-1], C0.shape[0]
  BV = min(st.cfg.bv_state, V)
  NV = V // BV
  sp = _Specs(H, T, K, BV, N if st.is_varlen else None)
  m16 = jnp.broadcast_to(m0[..., None], (*m0.shape, MW))
  flags = (starts, ends) if st.is_varlen else (None, None)
  args = [q, k, v, bh, bl, ig, C0, n0, m16, *flags]
  in_specs = [sp.tok(K, False), sp.tok(K, False), sp.tok(BV, True), sp.row(), sp.row(), sp.row(),
              sp.state(None, True), sp.state(K, False), sp.state(MW, False),
              *(spec_if(f, sp.flags()) for f in flags)]
  out_specs = [sp.tok(BV, True), sp.state(None, True), sp.state(K, False, True),
               sp.state(MW, False, True)]
  out_shape = [sds((B, T, H, V), q.dtype), sds(C0.shape, F32), sds((NV, N, H, K), F32),
               sds((NV, N, H, MW), F32)]
  if save:  # the residual stores; without them their refs are None
    out_specs += [sp.chunk_C(), sp.chunk_n()] + [sp.row(True)] * 3
    out_shape += [sds((B, sp.NT, H, K, V), q.dtype), sds((NV, B, sp.NT, H, K), F32)] + [
        sds((NV, B, H, T), F32)] * 3
  else:
    out_specs += [None] * 5
    out_shape += [None] * 5
  kern = functools.partial(_forward_kernel, NT=sp.NT, scale=st.scale)
  outs = launch(kern, (NV, B * H), in_specs, out_specs, out_shape, st, st.cfg.warps_forward,
                st.cfg.stages_state)(*args)
  o, Cf, nf, mf = outs[:4]
  final = (Cf, nf[0], mf[0, ..., 0])
  if not save:
    return o, final, None
  h, nh, m0t, mt, den = outs[4:]
  return o, final, (h, nh[0], m0t[0], mt[0], den[0])


# --- backward: the reverse state pass ------------------------------------------------------------

def _dstate_kernel(q_ref, do_ref, sq_ref, decay_ref, rz_ref, dd_ref, dCT_ref, dnT_ref, starts_ref,
                   ends_ref, dh_ref, dnh_ref, dC0_ref, dn0_ref, *, NT):
  """The reverse chunk loop; the varlen flags (starts_ref, ends_ref) None without varlen."""
  is_varlen = starts_ref is not None
  C = CHUNK
  dt = q_ref.dtype
  prec = precision(dt)

  def body(j, state):
    c = NT - 1 - j
    if is_varlen:
      state = state_at_flag(ends_ref[c], lambda e: (dCT_ref[e].astype(F32),
                                                    dnT_ref[e].astype(F32)), state)
    dS, dn = state
    dh_ref[c] = dS.astype(dh_ref.dtype)
    dnh_ref[c] = dn
    t0 = pl.multiple_of(c * C, C)
    sl = pl.ds(t0, C)
    decay = decay_ref[t0]
    qt = q_ref[sl, :].astype(F32) * sq_ref[sl][:, None]
    dnum = do_ref[sl, :].astype(F32) * rz_ref[sl][:, None]
    dS = decay * dS + dot_tn(qt.astype(dt), dnum.astype(dt), prec)
    dn = decay * dn + jnp.sum(qt * dd_ref[sl][:, None], axis=0)
    if is_varlen:
      store_at_flag(starts_ref[c], functools.partial(_store_state, (dC0_ref, dn0_ref), (dS, dn)))
    return dS, dn

  if is_varlen:
    state = (jnp.zeros(dC0_ref.shape[-2:], F32), jnp.zeros(dn0_ref.shape[-1:], F32))
  else:
    state = (dCT_ref[...].astype(F32), dnT_ref[...].astype(F32))
  dS, dn = lax.fori_loop(0, NT, body, state)
  if not is_varlen:
    dC0_ref[...], dn0_ref[...] = dS, dn


def dstate_pass(st: Static, q, do, sq, decay, rz, dd, dCT, dnT, starts, ends):
  """Rows [B, H, T]: sq = scale exp(x - m_t) (q~ = sq q), decay = exp(x_{C-1} - m') of the token's
  chunk, rz = 1 / Z, dd the denominator's cotangent. Returns dh [B, NT, H, K, V] (input dtype) and
  dn [B, NT, H, K] (float32), the state cotangents at each chunk's end, and d(C0, n0) of the
  initial state."""
  B, T, H, K = q.shape
  V, N = do.shape[-1], dCT.shape[0]
  BV = min(st.cfg.bv_state, V)
  NV = V // BV
  sp = _Specs(H, T, K, BV, N if st.is_varlen else None)
  flags = (starts, ends) if st.is_varlen else (None, None)
  args = [q, do, sq, decay, rz, dd, dCT, dnT, *flags]
  in_specs = ([sp.tok(K, False), sp.tok(BV, True)] + [sp.row()] * 4
              + [sp.state(None, True), sp.state(K, False)]
              + [spec_if(f, sp.flags()) for f in flags])
  out_specs = [sp.chunk_C(), sp.chunk_n(), sp.state(None, True), sp.state(K, False, True)]
  out_shape = [sds((B, sp.NT, H, K, V), q.dtype), sds((NV, B, sp.NT, H, K), F32),
               sds(dCT.shape, F32), sds((NV, N, H, K), F32)]
  kern = functools.partial(_dstate_kernel, NT=sp.NT)
  dh, dnh, dC0, dn0 = launch(kern, (NV, B * H), in_specs, out_specs, out_shape, st,
                             st.cfg.warps_state, st.cfg.stages_state)(*args)
  return dh, dnh[0], dC0, dn0[0]


# --- backward: the chunk-parallel gradients -------------------------------------------------------

def _dchunk_kernel(q_ref, k_ref, v_ref, do_ref, bh_ref, bl_ref, i_ref, m0t_ref, rz_ref, dd_ref,
                   dmn_ref, h_ref, n0_ref, dh_ref, dn_ref, dq_ref, dk_ref, dv_ref, di_ref, db_ref,
                   dm0_ref,
                   *, scale, bv):
  """One chunk and head (all of K; V in blocks of bv). di, db and dm0 are the chunk's own, with
  a zero cotangent on its end m' (the caller adds that share)."""
  C, K = k_ref.shape
  V = v_ref.shape[-1]
  dt = q_ref.dtype
  prec = precision(dt)
  q, k = q_ref[...], k_ref[...]
  rz, dd = rz_ref[...], dd_ref[...]
  ch = _chunk(bh_ref[...], bl_ref[...], i_ref[...], m0t_ref[...])
  P = dot_nt(q, k, prec) * (ch.E * scale)
  kw = k.astype(F32) * ch.w[:, None]
  kw_c, P_c = kw.astype(dt), P.astype(dt)
  dqt = dkw = jnp.zeros((C, K), F32)
  dP = jnp.zeros((C, C), F32)
  hdh = jnp.zeros((), F32)
  for j in range(V // bv):
    vs = pl.ds(j * bv, bv)
    h, dh, v = h_ref[:, vs], dh_ref[:, vs], v_ref[:, vs]
    dnum = (do_ref[:, vs].astype(F32) * rz[:, None]).astype(dt)
    dqt += dot_nt(dnum, h, prec)
    dP += dot_nt(dnum, v, prec)
    dkw += dot_nt(v, dh, prec)
    hdh += jnp.sum(h.astype(F32) * dh.astype(F32))
    dv_ref[:, vs] = (dot_tn(P_c, dnum, prec) + dot(kw_c, dh, prec)).astype(dv_ref.dtype)
  n0, dn = n0_ref[...], dn_ref[...]
  sq = scale * ch.sx
  qt = q.astype(F32) * sq[:, None]
  dqt += dd[:, None] * n0[None, :]
  dP = jnp.where(ch.causal, dP + dd[:, None], 0.0)
  dkw += dn[None, :]
  dz = jnp.sum(dqt * qt, axis=1)                              # d(x - m) per row
  dQK = dP * ch.E * scale
  dq = dqt * sq[:, None] + dot(dQK.astype(dt), k, prec)
  dk = dot_tn(dQK.astype(dt), q, prec) + dkw * ch.w[:, None]
  dL = dP * P
  dw = jnp.sum(dkw * k.astype(F32), axis=1) * ch.w           # d log w_s
  zdec = (hdh + jnp.sum(n0 * dn)) * ch.decay                  # d(x_{C-1} - m') through the decay
  rows = iota((C,), 0)
  dm = dmn_ref[...] - dz - jnp.sum(dL, axis=1) - jnp.where(rows == C - 1, zdec + jnp.sum(dw), 0.0)
  # m_t = max(x_t, max_s L_ts): the cotangent goes to the winner, ties split evenly.
  wx = max_weight(ch.x, ch.mrow)
  dx = dm * wx + dz
  hit = jnp.where(ch.L == ch.mrow[:, None], 1.0, 0.0)         # -inf above the diagonal never hits
  dL += hit * (dm * (1.0 - wx) / jnp.sum(hit, axis=1))[:, None]
  # The cotangent of b (the caller's reverse chunk cumsum turns it into dlog f): L_ts = b_t - b_s
  # + i_s, log w_s = b_{C-1} - b_s + i_s - m', x = b + m0, and b_{C-1} in the decay.
  db = (jnp.sum(dL, axis=1) - jnp.sum(dL, axis=0) + dx - dw
        + jnp.where(rows == C - 1, zdec + jnp.sum(dw), 0.0))
  dq_ref[...] = dq.astype(dq_ref.dtype)
  dk_ref[...] = dk.astype(dk_ref.dtype)
  di_ref[...] = jnp.sum(dL, axis=0) + dw
  db_ref[...] = db
  dm0_ref[...] = jnp.where(rows == 0, zdec + jnp.sum(dx), 0.0)


def dchunk_pass(st: Static, q, k, v, do, bh, bl, ig, m0t, rz, dd, dmn, h, nh, dh, dnh):
  B, T, H, K = q.shape
  V = v.shape[-1]
  C, NT = CHUNK, T // CHUNK
  tok = lambda D: pl.BlockSpec((None, C, None, D), lambda n, bh: (bh // H, n, bh % H, 0))
  row = pl.BlockSpec((None, None, C), lambda n, bh: (bh // H, bh % H, n))
  state = pl.BlockSpec((None, None, None, K, V), lambda n, bh: (bh // H, n, bh % H, 0, 0))
  vec = pl.BlockSpec((None, None, None, K), lambda n, bh: (bh // H, n, bh % H, 0))
  kern = functools.partial(_dchunk_kernel, scale=st.scale, bv=min(st.cfg.bv_chunk, V))
  return launch(kern, (NT, B * H),
                [tok(K), tok(K), tok(V), tok(V)] + [row] * 7 + [state, vec, state, vec],
                [tok(K), tok(K), tok(V)] + [row] * 3,
                [sds(q.shape, q.dtype), sds(q.shape, q.dtype), sds(v.shape, q.dtype)]
                + [sds(ig.shape, F32)] * 3,
                st, st.cfg.warps_chunk, st.cfg.stages_chunk)(
                     q, k, v, do, bh, bl, ig, m0t, rz, dd, dmn, h, nh, dh, dnh)
