"""mLSTM as Pallas GPU kernels (Triton lowering): `chunk_mlstm` under a custom_vjp and the
token-by-token `fused_recurrent_mlstm` (decode).

The math is xla.py's chunked form (README.md), per chunk of C = 64 tokens with the chunk-start state
(C0 [K, V], n0 [K], m0), log f and i as rows [C] (padding tokens: q = k = v = 0, log f = 0,
i = -1e30, which leaves the state unchanged):
  b_t = sum_{r <= t} log f_r (a chunk-local cumsum in XLA, kept as a double-float hi + lo),
  D_ts = sum_{s < r <= t} log f_r = b_t - b_s (float32-exact through hi and lo, as xla.py's sums over
  their own range are), L = D + i_s (s <= t), x = b + m0,
  m_t  = max(x_t, max_s L_ts)                                  (the recurrence's own m_t)
  P    = scale (q k^T) exp(L - m_t),  q~ = scale q exp(x - m_t)
  o    = (q~ C0 + P v) / (max(|q~ . n0 + sum_s P_ts|, exp(-m_t)) + eps)   (exp(-m) capped at e^80)
  m'   = m_{C-1},  w_s = exp(L_{C-1,s} - m'),  C' = exp(x_{C-1} - m') C0 + (k w)^T v,  n' likewise.

forward   `_forward` grid (V / BV, B*H), the chunks in a `lax.fori_loop` with (C [K, BV], n [K], m)
          in registers: o and the final state; when differentiated it also stores the chunk-start
          states (C in the input dtype, n and m float32) and per token m_t and the denominator.
backward  (residuals: the inputs, o and those stores; nothing is recomputed across chunks)
  1. per token in XLA: 1 / Z, the denominator's cotangent and the normalizer floor's share of dm_t
     (they need sum_v do o over all of V), q~'s row scale and each chunk's state decay;
  2. `_dstate` grid (V / BV, B*H), chunks in reverse: the state cotangents (dC, dn) at each chunk
     end, dC <- exp(x_{C-1} - m') dC + q~^T (do / Z), dn likewise, and d(C0, n0) of the initial state.
     Neither depends on the cotangent of m (the stabilizer enters the outputs only through the max
     and the normalizer);
  3. `_dchunk` grid (NT, B*H), one chunk per program (V in blocks of 64): dq, dk, dv and the chunk's
     local di, db and dm0 (those of the chunk with a zero cotangent on its end m'; dlog f is the
     reverse chunk cumsum of db);
  4. in XLA: the cotangent of each chunk's m' is an affine recurrence over chunks
     (dm0_c = local_c + [x_{C-1} wins the max] dm'_c, dm'_c = dm0_{c+1}), one associative scan; its
     share of di and dlog f is the vjp of m' = max(x_{C-1}, max_s L_{C-1,s}) in XLA.
Each max passes its cotangent to the argument that won (ties split evenly), as autodiff of xla.py
and reference.py does: the gradients of every input and of (C0, n0, m0) match theirs.

Supported: any B, T, H; K up to 256 and any V (slices of 256); bf16, f16 and f32 (K and V
zero-padded to powers of two >= 16 outside the kernels); initial_state, final state, cu_seqlens
(re-packed chunk-aligned by common.varlen; empty sequences keep their state). Matmul operands are in
the input dtype with float32 accumulators; the state, gates, stabilizer and denominators are float32.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from pallas_kernels.common import varlen
from pallas_kernels.common.chunk import suffix_sum
from pallas_kernels.common.gpu.config import Static  # (scale, is_varlen, interpret, cfg)
from pallas_kernels.common.gpu.kernel_math import F32, dot, dot_nt, dot_tn, iota, precision
from pallas_kernels.common.gpu.layout import (DTYPES, MAX_DIM, chunk_cumsum, compiler_params,
                                              next_pow2, pad_axis, sds)
from pallas_kernels.mlstm import reference
from pallas_kernels.mlstm.reference import EPS, MAX_NEG_LOG_NORM
from pallas_kernels.mlstm.xla import NO_INPUT

CHUNK = 64
MW = 16  # m is kept as a row of MW equal lanes in HBM (Triton loads and stores blocks, not scalars)


class Config(NamedTuple):
  """Tile sizes and launch parameters."""
  bv_state: int = 32      # value tile of the forward and reverse state passes
  warps_forward: int = 4  # the forward (its chunk math holds several [C, C] float32 tiles)
  warps_state: int = 4    # the reverse state pass
  stages_state: int = 2
  bv_chunk: int = 64      # value block of the loop inside the backward chunk kernel
  warps_chunk: int = 4
  stages_chunk: int = 1
  bv_decode: int = 32     # value tile of the decode kernel
  warps_decode: int = 4


DEFAULT = Config()


def unsupported(q, k, v, *_, **__) -> str | None:
  """Why the GPU kernels cannot run these inputs (None when they can): dispatch's `supports` hook."""
  if q.shape[-1] > MAX_DIM:
    return f"key head dim K={q.shape[-1]} above {MAX_DIM}"
  if q.dtype not in DTYPES:
    return f"dtype {q.dtype} (supported: bfloat16, float16, float32)"
  return None


def _check(q, k, v):
  reason = unsupported(q, k, v)
  if reason:
    raise ValueError(f"the Pallas GPU kernels cannot run these inputs: {reason}; use backend='xla'")


def _two_sum(a, b):
  """(a + b rounded, its rounding error): exact, Knuth's TwoSum."""
  s = a + b
  v = s - a
  return s, (a - (s - v)) + (b - v)


def _double_float_add(x, y):
  hi, err = _two_sum(x[0], y[0])
  err = err + (x[1] + y[1])
  s = hi + err
  return s, err - (s - hi)


def _chunk_cumsum_hi_lo(x):
  """The chunk-local inclusive cumsum b of x [..., T] (float32) as an unevaluated sum hi + lo (a
  prefix scan in double-float arithmetic, ~2^-44 relative): b_t - b_s = (hi_t - hi_s) + (lo_t - lo_s)
  then keeps float32 precision where b is in the hundreds and b_t - b_s is small."""
  xc = x.reshape(*x.shape[:-1], x.shape[-1] // CHUNK, CHUNK)
  hi, lo = lax.associative_scan(_double_float_add, (xc, jnp.zeros_like(xc)), axis=xc.ndim - 1)
  return hi.reshape(x.shape), lo.reshape(x.shape)


def _max_weight(a, b):
  """d max(a, b) / da as jax assigns it: 1 where a > b, 1/2 on ties, else 0."""
  return jnp.where(a > b, 1.0, jnp.where(a == b, 0.5, 0.0))


def _floor_and_weight(m):
  """(exp(-m) capped at exp(MAX_NEG_LOG_NORM), d/dm of it divided by -exp(-m): 1 below the cap)."""
  return reference.normalizer_floor(m), _max_weight(MAX_NEG_LOG_NORM, -m)


# --- in-kernel chunk math ------------------------------------------------------------------------

class _Chunk(NamedTuple):
  causal: jnp.ndarray   # [C, C] s <= t
  L: jnp.ndarray        # [C, C] D_ts + i_s, -inf above the diagonal
  mrow: jnp.ndarray     # [C] max_s L_ts
  x: jnp.ndarray        # [C] b_t + m0
  m: jnp.ndarray        # [C] the stabilizer m_t
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
  E = jnp.exp(L - m[:, None])
  m_end = _last(m)
  return _Chunk(causal, L, mrow, x, m, E, jnp.exp(_last(L) - m_end), m_end,
                jnp.exp(_last(x) - m_end))


def _enter(flags_ref, c, refs, state):
  """The initial state of sequence flags_ref[c] when chunk c starts one (flag >= 0), else `state`."""
  i = flags_ref[c]
  j = jnp.maximum(i, 0)
  C0_ref, n0_ref, m0_ref = refs
  return lax.cond(i >= 0, lambda: (C0_ref[j].astype(F32), n0_ref[j].astype(F32), jnp.max(m0_ref[j])),
                  lambda: state)


def _leave(flags_ref, c, refs, values):
  """refs[flags_ref[c]] = values when chunk c ends a sequence (flag >= 0)."""
  i = flags_ref[c]

  @pl.when(i >= 0)
  def _():
    for r, x in zip(refs, values):
      r[jnp.maximum(i, 0)] = x


# --- forward state pass with the output ----------------------------------------------------------

def _forward_kernel(*refs, NT, scale, is_varlen, save):
  q_ref, k_ref, v_ref, bh_ref, bl_ref, i_ref, C0_ref, n0_ref, m0_ref = refs[:9]
  refs = refs[9:]
  starts_ref, ends_ref = refs[:2] if is_varlen else (None, None)
  refs = refs[2:] if is_varlen else refs
  o_ref, Cf_ref, nf_ref, mf_ref = refs[:4]
  h_ref, nh_ref, m0t_ref, mt_ref, den_ref = refs[4:] if save else (None,) * 5
  C = CHUNK
  dt = q_ref.dtype
  prec = precision(dt)

  def body(c, state):
    if is_varlen:
      state = _enter(starts_ref, c, (C0_ref, n0_ref, m0_ref), state)
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
    qt = q.astype(F32) * (scale * jnp.exp(ch.x - ch.m))[:, None]
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
      _leave(ends_ref, c, (Cf_ref, nf_ref, mf_ref), (S, n, jnp.zeros((MW,), F32) + m))
    return S, n, m

  if is_varlen:
    state = (jnp.zeros(Cf_ref.shape[-2:], F32), jnp.zeros(nf_ref.shape[-1:], F32), jnp.zeros((), F32))
  else:
    state = (C0_ref[...].astype(F32), n0_ref[...].astype(F32), jnp.max(m0_ref[...]))
  S, n, m = lax.fori_loop(0, NT, body, state)
  if not is_varlen:
    Cf_ref[...], nf_ref[...], mf_ref[...] = S, n, jnp.zeros((MW,), F32) + m


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
    return pl.BlockSpec(lead + (N, None) + shape, lambda iv, bh: lead_ix(iv) + (0, bh % H) + tail(iv))

  def flags(self):
    return pl.BlockSpec((self.NT,), lambda iv, bh: (0,))


def _launch(kernel, grid, in_specs, out_specs, out_shape, st, warps, stages):
  return pl.pallas_call(kernel, grid=grid, in_specs=in_specs, out_specs=out_specs,
                        out_shape=out_shape, compiler_params=compiler_params(warps, stages),
                        interpret=st.interpret)


def _forward(st: Static, q, k, v, bh, bl, ig, C0, n0, m0, starts, ends, save: bool):
  """Padded inputs; bh + bl the chunk-local cumsum of log f, ig: [B, H, T] float32; C0 [N, H, K, V], n0 [N, H, K], m0 [N, H] float32.
  Returns o, (C, n, m) and, with save, (h [B, NT, H, K, V], n at chunk starts [B, NT, H, K],
  m0 per token [B, H, T], m_t [B, H, T], den [B, H, T])."""
  B, T, H, K = q.shape
  V, N = v.shape[-1], C0.shape[0]
  BV = min(st.cfg.bv_state, V)
  NV = V // BV
  sp = _Specs(H, T, K, BV, N if st.is_varlen else None)
  m16 = jnp.broadcast_to(m0[..., None], (*m0.shape, MW))
  args = [q, k, v, bh, bl, ig, C0, n0, m16]
  in_specs = [sp.tok(K, False), sp.tok(K, False), sp.tok(BV, True), sp.row(), sp.row(), sp.row(),
              sp.state(None, True), sp.state(K, False), sp.state(MW, False)]
  if st.is_varlen:
    args += [starts, ends]
    in_specs += [sp.flags()] * 2
  out_specs = [sp.tok(BV, True), sp.state(None, True), sp.state(K, False, True),
               sp.state(MW, False, True)]
  out_shape = [sds((B, T, H, V), q.dtype), sds(C0.shape, F32), sds((NV, N, H, K), F32),
               sds((NV, N, H, MW), F32)]
  if save:
    out_specs += [sp.chunk_C(), sp.chunk_n()] + [sp.row(True)] * 3
    out_shape += [sds((B, sp.NT, H, K, V), q.dtype), sds((NV, B, sp.NT, H, K), F32)] + [
        sds((NV, B, H, T), F32)] * 3
  kern = functools.partial(_forward_kernel, NT=sp.NT, scale=st.scale, is_varlen=st.is_varlen,
                           save=save)
  outs = _launch(kern, (NV, B * H), in_specs, out_specs, out_shape, st, st.cfg.warps_forward,
                 st.cfg.stages_state)(*args)
  o, Cf, nf, mf = outs[:4]
  final = (Cf, nf[0], mf[0, ..., 0])
  if not save:
    return o, final, None
  h, nh, m0t, mt, den = outs[4:]
  return o, final, (h, nh[0], m0t[0], mt[0], den[0])


# --- backward: the reverse state pass ------------------------------------------------------------

def _dstate_kernel(*refs, NT, is_varlen):
  q_ref, do_ref, sq_ref, decay_ref, rz_ref, dd_ref, dCT_ref, dnT_ref = refs[:8]
  refs = refs[8:]
  starts_ref, ends_ref = refs[:2] if is_varlen else (None, None)
  refs = refs[2:] if is_varlen else refs
  dh_ref, dnh_ref, dC0_ref, dn0_ref = refs
  C = CHUNK
  dt = q_ref.dtype
  prec = precision(dt)

  def body(j, state):
    c = NT - 1 - j
    if is_varlen:
      i = ends_ref[c]
      e = jnp.maximum(i, 0)
      state = lax.cond(i >= 0, lambda: (dCT_ref[e].astype(F32), dnT_ref[e].astype(F32)),
                       lambda: state)
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
      _leave(starts_ref, c, (dC0_ref, dn0_ref), (dS, dn))
    return dS, dn

  if is_varlen:
    state = (jnp.zeros(dC0_ref.shape[-2:], F32), jnp.zeros(dn0_ref.shape[-1:], F32))
  else:
    state = (dCT_ref[...].astype(F32), dnT_ref[...].astype(F32))
  dS, dn = lax.fori_loop(0, NT, body, state)
  if not is_varlen:
    dC0_ref[...], dn0_ref[...] = dS, dn


def _dstate(st: Static, q, do, sq, decay, rz, dd, dCT, dnT, starts, ends):
  """Rows [B, H, T]: sq = scale exp(x - m_t) (q~ = sq q), decay = exp(x_{C-1} - m') of the token's
  chunk, rz = 1 / Z, dd the denominator's cotangent. Returns dh [B, NT, H, K, V] (input dtype) and dn [B, NT, H, K] (float32), the state cotangents
  at each chunk's end, and d(C0, n0) of the initial state."""
  B, T, H, K = q.shape
  V, N = do.shape[-1], dCT.shape[0]
  BV = min(st.cfg.bv_state, V)
  NV = V // BV
  sp = _Specs(H, T, K, BV, N if st.is_varlen else None)
  args = [q, do, sq, decay, rz, dd, dCT, dnT]
  in_specs = [sp.tok(K, False), sp.tok(BV, True)] + [sp.row()] * 4 + [sp.state(None, True),
                                                                      sp.state(K, False)]
  if st.is_varlen:
    args += [starts, ends]
    in_specs += [sp.flags()] * 2
  out_specs = [sp.chunk_C(), sp.chunk_n(), sp.state(None, True), sp.state(K, False, True)]
  out_shape = [sds((B, sp.NT, H, K, V), q.dtype), sds((NV, B, sp.NT, H, K), F32),
               sds(dCT.shape, F32), sds((NV, N, H, K), F32)]
  kern = functools.partial(_dstate_kernel, NT=sp.NT, is_varlen=st.is_varlen)
  dh, dnh, dC0, dn0 = _launch(kern, (NV, B * H), in_specs, out_specs, out_shape, st,
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
  sq = scale * jnp.exp(ch.x - ch.m)
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
  wx = _max_weight(ch.x, ch.mrow)
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


def _dchunk(st: Static, q, k, v, do, bh, bl, ig, m0t, rz, dd, dmn, h, nh, dh, dnh):
  B, T, H, K = q.shape
  V = v.shape[-1]
  C, NT = CHUNK, T // CHUNK
  tok = lambda D: pl.BlockSpec((None, C, None, D), lambda n, bh: (bh // H, n, bh % H, 0))
  row = pl.BlockSpec((None, None, C), lambda n, bh: (bh // H, bh % H, n))
  state = pl.BlockSpec((None, None, None, K, V), lambda n, bh: (bh // H, n, bh % H, 0, 0))
  vec = pl.BlockSpec((None, None, None, K), lambda n, bh: (bh // H, n, bh % H, 0))
  kern = functools.partial(_dchunk_kernel, scale=st.scale, bv=min(st.cfg.bv_chunk, V))
  return _launch(kern, (NT, B * H),
                 [tok(K), tok(K), tok(V), tok(V)] + [row] * 7 + [state, vec, state, vec],
                 [tok(K), tok(K), tok(V)] + [row] * 3,
                 [sds(q.shape, q.dtype), sds(q.shape, q.dtype), sds(v.shape, q.dtype)]
                 + [sds(ig.shape, F32)] * 3,
                 st, st.cfg.warps_chunk, st.cfg.stages_chunk)(
                     q, k, v, do, bh, bl, ig, m0t, rz, dd, dmn, h, nh, dh, dnh)


# --- the custom_vjp -------------------------------------------------------------------------------

def _chunk_end_m(lf, ig, m0):
  """m' = max(b_{C-1} + m0, max_s (sum_{r > s} log f_r + i_s)) per chunk: lf, ig [B, H, NT, C],
  m0 [B, H, NT]. (The kernels' m at each chunk's last token; its vjp gives the share of the
  cotangent of m' in di, dlog f, dm0.)"""
  return jnp.maximum(jnp.sum(lf, axis=-1) + m0, jnp.max(suffix_sum(lf) + ig, axis=-1))


def _chunks(x):
  return x.reshape(*x.shape[:-1], x.shape[-1] // CHUNK, CHUNK)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _chunk_mlstm(st: Static, q, k, v, lf, ig, C0, n0, m0, starts, ends, empty):
  """(o, (C, n, m)) of padded inputs (lf, ig [B, H, T] float32; `empty` [N]: sequences without
  tokens, which keep their initial state)."""
  o, final, _ = _forward(st, q, k, v, *_chunk_cumsum_hi_lo(lf), ig, C0, n0, m0, starts, ends,
                         save=False)
  return o, _keep_empty(empty, final, (C0, n0, m0))


def _keep_empty(empty, new, old):
  if empty is None:
    return new
  return tuple(jnp.where(empty.reshape(-1, *([1] * (a.ndim - 1))), b, a) for a, b in zip(new, old))


def _chunk_mlstm_fwd(st, q, k, v, lf, ig, C0, n0, m0, starts, ends, empty):
  bh, bl = _chunk_cumsum_hi_lo(lf)
  o, final, saved = _forward(st, q, k, v, bh, bl, ig, C0, n0, m0, starts, ends, save=True)
  out = (o, _keep_empty(empty, final, (C0, n0, m0)))
  return out, (q, k, v, lf, bh, bl, ig, starts, ends, empty, o, *saved)


def _chunk_mlstm_bwd(st, res, cts):
  q, k, v, lf, bh, bl, ig, starts, ends, empty, o, h, nh, m0t, mt, den = res
  do, (dCT, dnT, dmT) = cts
  do = do.astype(q.dtype)
  # Per token: o = num / Z, Z = max(|den|, floor(m_t)) + eps.
  floor, below_cap = _floor_and_weight(mt)
  Z = jnp.maximum(jnp.abs(den), floor) + EPS
  dZ = -jnp.einsum("bthv,bthv->bht", do.astype(F32), o.astype(F32)) / Z
  wa = _max_weight(jnp.abs(den), floor)
  dd = dZ * wa * jnp.sign(den)
  dmn = -floor * below_cap * dZ * (1.0 - wa)
  x = (bh + bl) + m0t
  x_end, m_end = (jnp.repeat(_chunks(a)[..., -1], CHUNK, axis=-1) for a in (x, mt))
  sq = st.scale * jnp.exp(x - mt)
  dh, dnh, dC0, dn0 = _dstate(st, q, do, sq, jnp.exp(x_end - m_end), 1.0 / Z, dd, dCT, dnT, starts,
                              ends)
  dq, dk, dv, di, db, dm0_rows = _dchunk(st, q, k, v, do, bh, bl, ig, m0t, 1.0 / Z, dd, dmn, h,
                                         nh, dh, dnh)
  # The cotangent of each chunk's end m' (dm'_c = dm0_{c+1}, or the final state's at a sequence's
  # end): dm0_c = local_c + coef_c dm'_c, one reverse associative scan of affine maps.
  lf_c, ig_c, m0_c = _chunks(lf), _chunks(ig), m0t[..., ::CHUNK]
  local = dm0_rows[..., ::CHUNK]
  coef = _max_weight(jnp.sum(lf_c, axis=-1) + m0_c, jnp.max(suffix_sum(lf_c) + ig_c, axis=-1))
  B, H, NT = local.shape
  if st.is_varlen:
    is_end = ends >= 0
    dm_end = jnp.where(is_end, jnp.swapaxes(dmT, 0, 1)[:, jnp.maximum(ends, 0)], 0.0)[None]
  else:
    is_end = jnp.arange(NT) == NT - 1
    dm_end = jnp.where(is_end, dmT[..., None], 0.0)
  A = local + coef * dm_end
  Bc = jnp.where(is_end, 0.0, coef)
  combine = lambda later, cur: (cur[0] + cur[1] * later[0], cur[1] * later[1])
  y, _ = lax.associative_scan(combine, (A, Bc), reverse=True, axis=2)
  dm_next = jnp.where(is_end, dm_end, jnp.concatenate([y[..., 1:], jnp.zeros_like(y[..., :1])], -1))
  _, vjp = jax.vjp(lambda a, b: _chunk_end_m(a, b, m0_c), lf_c, ig_c)
  dlf_end, di_end = vjp(dm_next)
  dlf = chunk_cumsum(db, CHUNK, reverse=True) + dlf_end.reshape(db.shape)
  di = di + di_end.reshape(di.shape)
  if st.is_varlen:
    first = jnp.where(starts >= 0, starts, dmT.shape[0])      # chunk -> its sequence, or a dummy
    dm0 = jnp.zeros((dmT.shape[0] + 1, H), F32).at[first].add(jnp.swapaxes(y[0], 0, 1))[:-1]
  else:
    dm0 = y[..., 0]
  dC0, dn0, dm0 = _keep_empty(empty, (dC0, dn0, dm0), (dCT, dnT, dmT))
  return dq, dk, dv, dlf, di, dC0, dn0, dm0, None, None, None


_chunk_mlstm.defvjp(_chunk_mlstm_fwd, _chunk_mlstm_bwd)


def chunk_mlstm(q, k, v, i, f, *, scale, initial_state, cu_seqlens=None, interpret=False,
                config: Config = DEFAULT):
  """q, k [B, T, H, K]; v [B, T, H, V]; i, f [B, T, H] pre-activations.

  Returns (o [B, T, H, V] in q.dtype, (C [N, H, K, V], n [N, H, K], m [N, H]) float32), as xla.py.
  """
  _check(q, k, v)
  C0, n0, m0 = (s.astype(F32) for s in initial_state)
  if v.shape[-1] > MAX_DIM:
    # Value columns evolve independently given (n, m), which every slice computes alike.
    kw = dict(scale=scale, cu_seqlens=cu_seqlens, interpret=interpret, config=config)
    cuts = list(range(MAX_DIM, v.shape[-1], MAX_DIM))
    outs = [chunk_mlstm(q, k, v_j, i, f, initial_state=(C_j, n0, m0), **kw)
            for v_j, C_j in zip(jnp.split(v, cuts, -1), jnp.split(C0, cuts, -1))]
    (_, (_, n, m)) = outs[0]
    return (jnp.concatenate([o for o, _ in outs], -1),
            (jnp.concatenate([S[0] for _, S in outs], -1), n, m))
  B, T, H, K = q.shape
  V, dt = v.shape[-1], q.dtype
  k, v = k.astype(dt), v.astype(dt)
  lf, ig = jax.nn.log_sigmoid(f.astype(F32)), i.astype(F32)
  layout = empty = None
  if cu_seqlens is not None:
    layout = varlen.chunk_layout(cu_seqlens, T, CHUNK)
    q, k, v, lf = (varlen.pack(x, layout) for x in (q, k, v, lf))
    ig = varlen.pack(ig, layout, NO_INPUT)
    starts, ends = layout.segments
    empty = cu_seqlens[1:] == cu_seqlens[:-1]
  else:
    Tp = -(-T // CHUNK) * CHUNK
    q, k, v, lf = (pad_axis(x, 1, Tp) for x in (q, k, v, lf))
    ig = pad_axis(ig, 1, Tp, NO_INPUT)
    starts = ends = jnp.zeros((1,), jnp.int32)
  Kp, Vp = next_pow2(K), next_pow2(V)
  q, k, v = pad_axis(q, 3, Kp), pad_axis(k, 3, Kp), pad_axis(v, 3, Vp)
  C0p, n0p = pad_axis(pad_axis(C0, 2, Kp), 3, Vp), pad_axis(n0, 2, Kp)
  st = Static(float(scale), cu_seqlens is not None, bool(interpret), config)
  hm = lambda x: jnp.swapaxes(x, 1, 2)
  o, (C, n, m) = _chunk_mlstm(st, q, k, v, hm(lf), hm(ig), C0p, n0p, m0, starts, ends, empty)
  o = o[..., :V]
  o = o[:, :T] if layout is None else varlen.unpack(o, layout)
  return o, (C[:, :, :K, :V], n[:, :, :K], m)


# --- decode ---------------------------------------------------------------------------------------

def _decode_kernel(*refs, scale, is_varlen, H):
  cu_ref, refs = (refs[0], refs[1:]) if is_varlen else (None, refs)
  q_ref, k_ref, v_ref, lf_ref, i_ref, C0_ref, n0_ref, m0_ref, o_ref, Cf_ref, nf_ref, mf_ref = refs

  def body(t, state):
    S, n, m = state
    q, k, v = (r[t, :].astype(F32) for r in (q_ref, k_ref, v_ref))
    lf, ig = lf_ref[t], i_ref[t]
    m_new = jnp.maximum(lf + m, ig)
    fa, ia = jnp.exp(lf + m - m_new), jnp.exp(ig - m_new)
    S = fa * S + (ia * k)[:, None] * v[None, :]
    n = fa * n + ia * k
    qs = q * scale
    num = jnp.sum(S * qs[:, None], axis=0)
    den = jnp.abs(jnp.sum(n * qs))
    o_ref[t, :] = (num / (jnp.maximum(den, reference.normalizer_floor(m_new)) + EPS)).astype(o_ref.dtype)
    return S, n, m_new

  if is_varlen:
    seq = pl.program_id(0) // H
    lo, hi = cu_ref[seq], cu_ref[seq + 1]
  else:
    lo, hi = 0, q_ref.shape[0]
  state = (C0_ref[...].astype(F32), n0_ref[...].astype(F32), jnp.max(m0_ref[...]))
  S, n, m = lax.fori_loop(lo, hi, body, state)
  Cf_ref[...], nf_ref[...], mf_ref[...] = S, n, jnp.zeros((MW,), F32) + m


def _decode(q, k, v, lf, ig, C0, n0, m0, cu_seqlens, *, scale, interpret, cfg):
  """Padded inputs (K, V powers of two); lf, ig [B, H, T] float32. Returns (o, (C, n, m))."""
  B, T, H, K = q.shape
  V, N = v.shape[-1], C0.shape[0]
  bv = min(cfg.bv_decode, V)
  NV = V // bv
  is_varlen = cu_seqlens is not None
  seq = (lambda nh: 0) if is_varlen else (lambda nh: nh // H)  # the batch row of program nh
  tok = lambda D, tiled: pl.BlockSpec((None, T, None, D),
                                      lambda nh, iv: (seq(nh), 0, nh % H, iv if tiled else 0))
  row = pl.BlockSpec((None, None, T), lambda nh, iv: (seq(nh), nh % H, 0))
  state = pl.BlockSpec((None, None, K, bv), lambda nh, iv: (nh // H, nh % H, 0, iv))
  vec = lambda D, per_tile: pl.BlockSpec(
      ((None,) if per_tile else ()) + (None, None, D),
      lambda nh, iv: ((iv,) if per_tile else ()) + (nh // H, nh % H, 0))
  in_specs = [tok(K, False), tok(K, False), tok(bv, True), row, row, state, vec(K, False),
              vec(MW, False)]
  args = [q, k, v, lf, ig, C0, n0, jnp.broadcast_to(m0[..., None], (N, H, MW))]
  if is_varlen:
    in_specs.insert(0, pl.BlockSpec((N + 1,), lambda nh, iv: (0,)))
    args.insert(0, cu_seqlens.astype(jnp.int32))
  kernel = functools.partial(_decode_kernel, scale=scale, is_varlen=is_varlen, H=H)
  o, C, n, m = pl.pallas_call(
      kernel, grid=(N * H, NV), in_specs=in_specs,
      out_specs=[tok(bv, True), state, vec(K, True), vec(MW, True)],
      out_shape=[sds(v.shape, q.dtype), sds(C0.shape, F32), sds((NV, N, H, K), F32),
                 sds((NV, N, H, MW), F32)],
      compiler_params=compiler_params(cfg.warps_decode, 1), interpret=interpret)(*args)
  return o, (C, n[0], m[0, ..., 0])


@functools.partial(jax.custom_vjp, nondiff_argnums=(7,))
def _recurrent(q, k, v, i, f, h0, cu_seqlens, static):
  scale, interpret, cfg = static
  B, T, H, K = q.shape
  V = v.shape[-1]
  Kp, Vp = next_pow2(K), next_pow2(V)
  C0, n0, m0 = h0
  hm = lambda x: jnp.swapaxes(x.astype(F32), 1, 2)
  o, (C, n, m) = _decode(pad_axis(q, 3, Kp), pad_axis(k.astype(q.dtype), 3, Kp),
                         pad_axis(v.astype(q.dtype), 3, Vp), hm(jax.nn.log_sigmoid(f.astype(F32))),
                         hm(i), pad_axis(pad_axis(C0, 2, Kp), 3, Vp), pad_axis(n0, 2, Kp), m0,
                         cu_seqlens, scale=scale, interpret=interpret, cfg=cfg)
  return o[..., :V], (C[:, :, :K, :V], n[:, :, :K], m)


def _recurrent_fwd(q, k, v, i, f, h0, cu_seqlens, static):
  return _recurrent(q, k, v, i, f, h0, cu_seqlens, static), (q, k, v, i, f, h0, cu_seqlens)


def _recurrent_bwd(static, res, cts):
  """The float32 reference recurrence's vjp: decoding needs no gradient, training runs the chunked
  kernels."""
  q, k, v, i, f, h0, cu_seqlens = res
  fn = lambda q, k, v, i, f, h0: reference.fused_recurrent_mlstm(
      q, k, v, i, f, scale=static[0], initial_state=h0, cu_seqlens=cu_seqlens)
  _, vjp = jax.vjp(fn, q, k, v, i, f, h0)
  return (*vjp(cts), None)


_recurrent.defvjp(_recurrent_fwd, _recurrent_bwd)


def fused_recurrent_mlstm(q, k, v, i, f, *, scale, initial_state, cu_seqlens=None,
                          interpret=False, config: Config = DEFAULT):
  """Token by token (decode): grid (N * H, V / BV), each program a float32 (C [K, BV], n [K], m)
  in registers walking its sequence's tokens. Same arguments and returns as chunk_mlstm."""
  _check(q, k, v)
  h0 = tuple(s.astype(F32) for s in initial_state)
  return _recurrent(q, k, v, i, f, h0, cu_seqlens, (float(scale), bool(interpret), config))
