"""mLSTM as Pallas GPU kernels (Triton lowering): `chunk_mlstm` under a custom_vjp and the
token-by-token `fused_recurrent_mlstm` (decode).

The math is xla.py's chunked form (README.md), per chunk of C = 64 tokens with the chunk-start state
(C0 [K, V], n0 [K], m0), log f and i as rows [C] (padding tokens: q = k = v = 0, log f = 0,
i = -1e30, which leaves the state unchanged):
  b_t = sum_{r <= t} log f_r (a chunk-local cumsum in XLA, kept as a double-float hi + lo),
  D_ts = sum_{s < r <= t} log f_r = b_t - b_s (float32-exact through hi and lo, as xla.py's sums
  over their own range are), L = D + i_s (s <= t), x = b + m0,
  m_t  = max(x_t, max_s L_ts)                                  (the recurrence's own m_t)
  P    = scale (q k^T) exp(L - m_t),  q~ = scale q exp(x - m_t)
  o    = (q~ C0 + P v) / (max(|q~ . n0 + sum_s P_ts|, exp(-m_t)) + eps)   (exp(-m) capped at e^80)
  m'   = m_{C-1},  w_s = exp(L_{C-1,s} - m'),  C' = exp(x_{C-1} - m') C0 + (k w)^T v,  n' likewise.

forward   `forward_pass` grid (V / BV, B*H), the chunks in a `lax.fori_loop` with (C [K, BV], n [K],
          m) in registers: o and the final state; when differentiated it also stores the chunk-start
          states (C in the input dtype, n and m float32) and per token m_t and the denominator.
backward  (residuals: the inputs, o and those stores; nothing is recomputed across chunks)
  1. per token in XLA: 1 / Z, the denominator's cotangent and the normalizer floor's share of dm_t
     (they need sum_v do o over all of V), q~'s row scale and each chunk's state decay;
  2. `dstate_pass` grid (V / BV, B*H), chunks in reverse: the state cotangents (dC, dn) at each
     chunk end, dC <- exp(x_{C-1} - m') dC + q~^T (do / Z), dn likewise, and d(C0, n0) of the
     initial state.
     Neither depends on the cotangent of m (the stabilizer enters the outputs only through the max
     and the normalizer);
  3. `dchunk_pass` grid (NT, B*H), one chunk per program (V in blocks of 64): dq, dk, dv and the
     chunk's local di, db and dm0 (those of the chunk with a zero cotangent on its end m'; dlog f
     is the reverse chunk cumsum of db);
  4. in XLA: the cotangent of each chunk's m' is an affine recurrence over chunks
     (dm0_c = local_c + [x_{C-1} wins the max] dm'_c, dm'_c = dm0_{c+1}), one associative scan; its
     share of di and dlog f is the vjp of m' = max(x_{C-1}, max_s L_{C-1,s}) in XLA.
Each max passes its cotangent to the argument that won (ties split evenly), as autodiff of xla.py
and reference.py does: the gradients of every input and of (C0, n0, m0) match theirs.

Supported: any B, T, H; K up to 256 and any V (slices of 256); bf16, f16 and f32 (K and V
zero-padded to powers of two >= 16 outside the kernels); initial_state, final state, cu_seqlens
(re-packed chunk-aligned by common.varlen; empty sequences keep their state). Matmul operands are
in the input dtype with float32 accumulators; the state, gates, stabilizer and denominators are
float32. The kernels themselves are in gpu_chunk.py.
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
from pallas_kernels.common.gpu.fused_recurrent import decode_specs
from pallas_kernels.common.gpu.kernel_math import F32
from pallas_kernels.common.gpu.layout import (DTYPES, MAX_DIM, call, chunk_cumsum, next_pow2,
                                              pad_axis, sds, spec_if)
from pallas_kernels.mlstm import reference
from pallas_kernels.mlstm.gpu_chunk import (CHUNK, MW, dchunk_pass, dstate_pass, forward_pass,
                                            max_weight)
from pallas_kernels.mlstm.reference import EPS, MAX_NEG_LOG_NORM
from pallas_kernels.mlstm.xla import NO_INPUT


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
  """Why the GPU kernels cannot run these inputs (None when they can): the dispatch hook."""
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
  prefix scan in double-float arithmetic, ~2^-44 relative): b_t - b_s = (hi_t - hi_s) +
  (lo_t - lo_s) then keeps float32 precision where b is in the hundreds and b_t - b_s is small."""
  xc = x.reshape(*x.shape[:-1], x.shape[-1] // CHUNK, CHUNK)
  hi, lo = lax.associative_scan(_double_float_add, (xc, jnp.zeros_like(xc)), axis=xc.ndim - 1)
  return hi.reshape(x.shape), lo.reshape(x.shape)


def _floor_and_weight(m):
  """(exp(-m) capped at exp(MAX_NEG_LOG_NORM), d/dm of it divided by -exp(-m): 1 below the cap)."""
  return reference.normalizer_floor(m), max_weight(MAX_NEG_LOG_NORM, -m)


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
  o, final, _ = forward_pass(st, q, k, v, *_chunk_cumsum_hi_lo(lf), ig, C0, n0, m0, starts, ends,
                         save=False)
  return o, _keep_empty(empty, final, (C0, n0, m0))


def _keep_empty(empty, new, old):
  if empty is None:
    return new
  return tuple(jnp.where(empty.reshape(-1, *([1] * (a.ndim - 1))), b, a) for a, b in zip(new, old))


def _chunk_mlstm_fwd(st, q, k, v, lf, ig, C0, n0, m0, starts, ends, empty):
  bh, bl = _chunk_cumsum_hi_lo(lf)
  o, final, saved = forward_pass(st, q, k, v, bh, bl, ig, C0, n0, m0, starts, ends, save=True)
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
  wa = max_weight(jnp.abs(den), floor)
  dd = dZ * wa * jnp.sign(den)
  dmn = -floor * below_cap * dZ * (1.0 - wa)
  # exp(x - m) and exp(x_{C-1} - m') with x = b + m0, the large terms differenced first (_chunk)
  at_end = lambda a: jnp.repeat(_chunks(a)[..., -1], CHUNK, axis=-1)
  sq = st.scale * jnp.exp(((m0t - mt) + bh) + bl)
  decay = jnp.exp(((at_end(m0t) - at_end(mt)) + at_end(bh)) + at_end(bl))
  dh, dnh, dC0, dn0 = dstate_pass(st, q, do, sq, decay, 1.0 / Z, dd, dCT, dnT,
                                  starts, ends)
  dq, dk, dv, di, db, dm0_rows = dchunk_pass(st, q, k, v, do, bh, bl, ig, m0t, 1.0 / Z, dd, dmn,
                                             h, nh, dh, dnh)
  # The cotangent of each chunk's end m' (dm'_c = dm0_{c+1}, or the final state's at a sequence's
  # end): dm0_c = local_c + coef_c dm'_c, one reverse associative scan of affine maps.
  lf_c, ig_c, m0_c = _chunks(lf), _chunks(ig), m0t[..., ::CHUNK]
  local = dm0_rows[..., ::CHUNK]
  coef = max_weight(jnp.sum(lf_c, axis=-1) + m0_c, jnp.max(suffix_sum(lf_c) + ig_c, axis=-1))
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
  plan = varlen.chunk_plan(T, CHUNK, cu_seqlens)
  q, k, v, lf = (varlen.to_chunked(x, plan) for x in (q, k, v, lf))
  ig = varlen.to_chunked(ig, plan, NO_INPUT)
  starts, ends = plan.segments or (None, None)
  empty = None if cu_seqlens is None else cu_seqlens[1:] == cu_seqlens[:-1]
  Kp, Vp = next_pow2(K), next_pow2(V)
  q, k, v = pad_axis(q, 3, Kp), pad_axis(k, 3, Kp), pad_axis(v, 3, Vp)
  C0p, n0p = pad_axis(pad_axis(C0, 2, Kp), 3, Vp), pad_axis(n0, 2, Kp)
  st = Static(float(scale), cu_seqlens is not None, bool(interpret), config)
  hm = lambda x: jnp.swapaxes(x, 1, 2)
  o, (C, n, m) = _chunk_mlstm(st, q, k, v, hm(lf), hm(ig), C0p, n0p, m0, starts, ends, empty)
  return varlen.from_chunked(o[..., :V], plan), (C[:, :, :K, :V], n[:, :, :K], m)


# --- decode ---------------------------------------------------------------------------------------

def _decode_kernel(cu_ref, q_ref, k_ref, v_ref, lf_ref, i_ref, C0_ref, n0_ref, m0_ref, o_ref,
                   Cf_ref, nf_ref, mf_ref, *, scale, H):
  """cu_ref (cu_seqlens) None without varlen."""

  def body(t, state):
    S, n, m = state
    q, k, v = (r[t, :].astype(F32) for r in (q_ref, k_ref, v_ref))
    lf, ig = lf_ref[t], i_ref[t]
    m_new = jnp.maximum(lf + m, ig)
    fa, ia = jnp.exp((m - m_new) + lf), jnp.exp(ig - m_new)
    S = fa * S + (ia * k)[:, None] * v[None, :]
    n = fa * n + ia * k
    qs = q * scale
    num = jnp.sum(S * qs[:, None], axis=0)
    den = jnp.abs(jnp.sum(n * qs))
    Z = jnp.maximum(den, reference.normalizer_floor(m_new)) + EPS
    o_ref[t, :] = (num / Z).astype(o_ref.dtype)
    return S, n, m_new

  if cu_ref is not None:
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
  tok, row, state = decode_specs(T, H, K, bv, is_varlen)
  vec = lambda D, per_tile: pl.BlockSpec(
      ((None,) if per_tile else ()) + (None, None, D),
      lambda nh, iv: ((iv,) if per_tile else ()) + (nh // H, nh % H, 0))
  cu = cu_seqlens.astype(jnp.int32) if is_varlen else None
  in_specs = [spec_if(cu, pl.BlockSpec((N + 1,), lambda nh, iv: (0,))), tok(K, False),
              tok(K, False), tok(bv, True), row, row, state, vec(K, False), vec(MW, False)]
  args = [cu, q, k, v, lf, ig, C0, n0, jnp.broadcast_to(m0[..., None], (N, H, MW))]
  # each program walks one sequence: B * T // N tokens on average
  o, C, n, m = call(functools.partial(_decode_kernel, scale=scale, H=H), (N * H, NV), in_specs,
                    [tok(bv, True), state, vec(K, True), vec(MW, True)],
                    [sds(v.shape, q.dtype), sds(C0.shape, F32), sds((NV, N, H, K), F32),
                     sds((NV, N, H, MW), F32)], interpret=interpret, warps=cfg.warps_decode,
                    stages=1, loop_trips=B * T // N)(*args)
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
