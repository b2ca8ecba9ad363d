"""Chunked GLA with a per-channel decay as Pallas GPU kernels (Triton lowering), with a custom_vjp.

The math is xla.py's chunked form (README.md). G is the chunk-local gate cumsum [C, K] (float32,
formed and written by the state pass), Gq the query side's (G for GLA; G - g for RWKV-6, which
reads the state before its token), C = 64, and every chunk is split into four 16-row sub-chunks:

forward
  1. `state_pass` (gpu_state.py) grid (V/BV, B*H): G, the chunk-start states h [B, NT, H, K, V]
                  (input dtype) and the final state.
  2. `_output`    grid (NT, B*H), per 16-row query block p: the scores A (the keys of earlier blocks
                  through one dot, both sides taken relative to the block's first row r so every
                  exponent is <= 0; the diagonal 16 x 16 block key by key, masked before the exp),
                  o = scale (q exp(Gq)) h + A v. A is stored (input dtype) for the backward.
backward (residuals: the inputs and A; h is recomputed, never stored by the forward)
  3. `state_pass` again (G, h).
  4. `dh_pass`    (gpu_state.py) grid (V/BV, B*H), chunks in reverse: dh (the state gradient at each
                  chunk end), d initial_state and dv = A^T do + (k exp(G_C - G)) dh.
  5. `_dqkg`      grid (K/BK, NT, B*H), per 16-row block: dA = scale do v^T, dq and dk (state parts
                  plus the intra-chunk parts in the forward's sub-chunk factorisation) and dg, the
                  reverse chunk-local cumsum of dG = q dq - k dk plus the decay's gradient at the
                  chunk end, sum_v dh (exp(G_C) h + (k exp(G_C - G))^T v), which reaches every row.
The per-channel products are exact per key tile, so dg needs no sum over tiles. Tile axes come first
in the grids: Triton launches axis 0 fastest, so programs that read the same head and chunk run
side by side and share their inputs through L2.

Supported: any B, T, H; K and V up to 256 (zero-padded to powers of two >= 16 outside the kernels);
bf16, f16 and f32; initial_state, final state, cu_seqlens (re-packed chunk-aligned by
common.varlen). Matmul operands are in the input dtype with a float32 accumulator; the state, the
gates and the accumulators are float32.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from pallas_kernels.common import varlen
from pallas_kernels.common.gpu.kernel_math import (F32, SUB, dot, dot_nt, dot_tn, iota,
                                                   precision)
from pallas_kernels.common.gpu.layout import DTYPES, MAX_DIM, Specs, next_pow2, pad_axis
from pallas_kernels.gla import reference
from pallas_kernels.gla.gpu_state import (CHUNK, call, decayed_rows, dh_pass, sds, state_pass)



class Config(NamedTuple):
  """Tile sizes and launch parameters."""
  bv_state: int = 32      # value tile of the state and dh passes
  warps_state: int = 4
  stages_state: int = 2
  warps_out: int = 4      # output kernel (forward)
  bk_dqkg: int = 64       # key tile (grid axis) of the dq/dk/dg kernel
  warps_dqkg: int = 4
  stages_chunk: int = 1   # chunk-parallel kernels


DEFAULT = Config()


class _Static(NamedTuple):
  scale: float
  varlen: bool
  interpret: bool
  cfg: Config
  exclusive: bool = False  # RWKV-6: o_t reads S_{t-1} (Gq = G - g, strict intra-chunk mask)


def unsupported(q, k, v, g=None, *_, **__) -> str | None:
  """Why the GPU kernels cannot run these inputs (None when they can): dispatch's `supports` hook."""
  K, V = q.shape[-1], v.shape[-1]
  if g is not None and g.ndim != 4:
    return f"gates of shape {g.shape} (the GLA kernels take per-channel gates [B, T, H, K])"
  if K > MAX_DIM or V > MAX_DIM:
    return f"head dims K={K}, V={V} (at most {MAX_DIM})"
  if q.dtype not in DTYPES:
    return f"dtype {q.dtype} (supported: bfloat16, float16, float32)"
  return None


# --- 2. forward output: intra-chunk scores and o -------------------------------------------------

def _diagonal_decay(Gq, g_j, t, sub_row, u_ref):
  """exp(Gq_i - G_j) [16, K] for the rows i of a diagonal block and its key row j = its row t,
  masked before the exp: i >= t, or i > t with the diagonal taken by the bonus u (RWKV-6)."""
  if u_ref is None:
    return jnp.exp(jnp.where(sub_row >= t, Gq - g_j[None, :], -jnp.inf))
  E = jnp.exp(jnp.where(sub_row > t, Gq - g_j[None, :], -jnp.inf))
  return jnp.where(sub_row == t, u_ref[...][None, :], E)


def _output_kernel(*refs, scale, exclusive):
  """One chunk and head. Query block p: A_p [16, C] = keys of blocks < p by one dot relative to the
  block's first row r (exp(Gq_i - Gq_r) <= 1, exp(Gq_r - G_j) <= 1 for j < r), plus the diagonal
  block key by key (exponents masked before the exp); then o_p = scale (q_p exp(Gq_p)) h + A_p v.
  exclusive (RWKV-6): strict mask, and the bonus scale q_i . (u k_i) is A's diagonal entry."""
  q_ref, k_ref, v_ref, g_ref = refs[:4]
  gq_ref, u_ref = refs[4:6] if exclusive else (g_ref, None)
  h_ref, o_ref, a_ref = refs[-3:]
  C, K = k_ref.shape
  dt = q_ref.dtype
  prec = precision(dt)
  h = h_ref[...]
  key_row = iota((C, K), 0)
  sub_row, col = iota((SUB, K), 0), iota((SUB, C), 1)
  for p in range(C // SUB):
    rows = pl.ds(p * SUB, SUB)
    q, Gq = q_ref[rows, :].astype(F32), gq_ref[rows, :]
    A = jnp.zeros((SUB, C), F32)
    if p:
      g_r = gq_ref[p * SUB, :][None, :]
      qa = (q * jnp.exp(Gq - g_r)).astype(dt)
      before_r = jnp.where(key_row < p * SUB, g_r - g_ref[...], -jnp.inf)
      ka = k_ref[...].astype(F32) * jnp.exp(before_r)
      A = dot_nt(qa, ka.astype(dt), prec)

    def diagonal(t, A, p=p, q=q, Gq=Gq):
      j = p * SUB + t
      E = _diagonal_decay(Gq, g_ref[j, :], t, sub_row, u_ref)
      s = jnp.sum(q * k_ref[j, :].astype(F32)[None, :] * E, axis=1)
      return jnp.where(col == j, s[:, None], A)

    A = lax.fori_loop(0, SUB, diagonal, A) * scale
    a_ref[rows, :] = A.astype(a_ref.dtype)
    o = dot((q * (jnp.exp(Gq) * scale)).astype(dt), h, prec) + dot(A.astype(dt), v_ref[...], prec)
    o_ref[rows, :] = o.astype(o_ref.dtype)


def _output(q, k, v, G, Gq, u, h, st: _Static):
  """Returns o [B, T, H, V] and the scores A [B, T, H, C] (row t: token t's scores over its chunk),
  both in the input dtype."""
  B, T, H, K = q.shape
  V = v.shape[-1]
  sp = Specs(H, CHUNK, T)
  gates = [G] if Gq is None else [G, Gq, u]
  gate_specs = [sp.chunk_tok(K)] * (1 + st.exclusive)
  if st.exclusive:
    gate_specs.append(pl.BlockSpec((None, K), lambda n, bh: (bh % H, 0)))
  kern = functools.partial(_output_kernel, scale=st.scale, exclusive=st.exclusive)
  return call(kern, (sp.NT, B * H),
              [sp.chunk_tok(K), sp.chunk_tok(K), sp.chunk_tok(V)] + gate_specs
              + [sp.chunk_state(K, V)],
              [sp.chunk_tok(V), sp.chunk_tok(CHUNK)],
              [sds((B, T, H, V), q.dtype), sds((B, T, H, CHUNK), q.dtype)],
              interpret=st.interpret, warps=st.cfg.warps_out,
              stages=st.cfg.stages_chunk)(q, k, v, *gates, h)


# --- 5. dq, dk, dg --------------------------------------------------------------------------------

def _dqkg_kernel(*refs, scale, exclusive):
  """One chunk, head and key tile (q, k, G, h, dh hold that tile of the key axis; v, do all of V).
  Blocks are visited last to first so that dg, a reverse cumsum, carries the later blocks' sum."""
  q_ref, k_ref, g_ref = refs[:3]
  gq_ref, u_ref = refs[3:5] if exclusive else (g_ref, None)
  v_ref, do_ref, h_ref, dh_ref, dq_ref, dk_ref, dg_ref = refs[5:12] if exclusive else refs[3:10]
  du_ref = refs[12] if exclusive else None
  C, BK = k_ref.shape
  n = C // SUB
  dt = q_ref.dtype
  prec = precision(dt)
  h, dh = h_ref[...], dh_ref[...]
  g_last = g_ref[C - 1, :]
  # The gradient of G_C through the state update, sum_v dh * S_end: in every row's dg.
  S_end = (h.astype(F32) * jnp.exp(g_last)[:, None]
           + dot_tn(decayed_rows(k_ref[...], g_ref[...], g_last, dt), v_ref[...], prec))
  later = jnp.sum(S_end * dh.astype(F32), axis=1)[None, :]      # [1, BK]
  tok_row = iota((C, BK), 0)
  sub_row, col = iota((SUB, BK), 0), iota((SUB, C), 1)
  du = jnp.zeros((BK,), F32)
  for p in reversed(range(n)):
    rows = pl.ds(p * SUB, SUB)
    q, k = q_ref[rows, :].astype(F32), k_ref[rows, :].astype(F32)
    G, Gq = g_ref[rows, :], gq_ref[rows, :]
    do, v = do_ref[rows, :], v_ref[rows, :]
    dA = dot_nt(do, v_ref[...], prec) * scale           # [16, C]: dA_ij, i in this block
    dq = dot_nt(do, h, prec) * (jnp.exp(Gq) * scale)     # state parts
    dk = dot_nt(v, dh, prec) * jnp.exp(g_last[None, :] - G)
    if p > 0:      # keys of earlier blocks, relative to this block's first query row r
      g_r = gq_ref[p * SUB, :][None, :]
      before_r = jnp.where(tok_row < p * SUB, g_r - g_ref[...], -jnp.inf)
      ka = k_ref[...].astype(F32) * jnp.exp(before_r)
      dq += dot(dA.astype(dt), ka.astype(dt), prec) * jnp.exp(Gq - g_r)
    if p < n - 1:  # queries of later blocks, relative to this block's last key row e
      g_e = g_ref[p * SUB + SUB - 1, :][None, :]
      dAT = dot_nt(v, do_ref[...], prec) * scale         # [16, C]: dA_ij, j in this block
      qa = q_ref[...].astype(F32) * jnp.exp(
          jnp.where(tok_row >= (p + 1) * SUB, gq_ref[...] - g_e, -jnp.inf))
      dk += dot(dAT.astype(dt), qa.astype(dt), prec) * jnp.exp(g_e - G)

    def diagonal(t, carry, p=p, q=q, Gq=Gq, dA=dA):
      dq, dk, *dq_bonus = carry
      j = p * SUB + t
      a = jnp.sum(jnp.where(col == j, dA, 0.0), axis=1)[:, None]           # dA_ij
      aE = a * _diagonal_decay(Gq, g_ref[j, :], t, sub_row, u_ref)        # dA_ij exp(Gq_i - G_j)
      k_j = k_ref[j, :].astype(F32)[None, :]
      dq += aE * k_j
      dk += jnp.where(sub_row == t, jnp.sum(aE * q, axis=0)[None, :], 0.0)
      if exclusive:  # dA_jj q_j k_j: the bonus's share of q dq, and du's term
        dq_bonus = [dq_bonus[0] + jnp.where(sub_row == t, a * q * k_j, 0.0)]
      return dq, dk, *dq_bonus

    carry = (dq, dk) + (jnp.zeros_like(dq),) * exclusive
    dq, dk, *dq_bonus = lax.fori_loop(0, SUB, diagonal, carry)
    dq_ref[rows, :] = dq.astype(dq_ref.dtype)
    dk_ref[rows, :] = dk.astype(dk_ref.dtype)
    dGq = q * dq
    dG = dGq - k * dk                                      # (the bonus's terms cancel here)
    total = jnp.sum(dG, axis=0)[None, :]
    dg = later + total - jnp.cumsum(dG, axis=0) + dG       # sum over rows >= t of the chunk
    later = later + total
    if exclusive:  # Gq = G - g: the decays' share of q dq reaches g directly, negated
      dg -= dGq - u_ref[...][None, :] * dq_bonus[0]
      du = du + jnp.sum(dq_bonus[0], axis=0)
    dg_ref[rows, :] = dg
  if exclusive:
    du_ref[...] = du


def _dqkg(q, k, v, G, Gq, u, do, h, dh, st: _Static):
  """Returns dq, dk (input dtype), dg [B, T, H, K] (float32, the raw gate's gradient) and, for
  RWKV-6, du [H, K] (float32)."""
  B, T, H, K = q.shape
  V = v.shape[-1]
  BK = min(st.cfg.bk_dqkg, K)
  C = CHUNK
  tile = pl.BlockSpec((None, C, None, BK), lambda ik, n, bh: (bh // H, n, bh % H, ik))
  full = pl.BlockSpec((None, C, None, V), lambda ik, n, bh: (bh // H, n, bh % H, 0))
  state = pl.BlockSpec((None, None, None, BK, V), lambda ik, n, bh: (bh // H, n, bh % H, ik, 0))
  gates, gate_specs = [G], [tile]
  outs, out_specs = [sds(q.shape, q.dtype), sds(q.shape, q.dtype), sds(q.shape, F32)], [tile] * 3
  if st.exclusive:
    gates += [Gq, u]
    gate_specs += [tile, pl.BlockSpec((None, BK), lambda ik, n, bh: (bh % H, ik))]
    outs.append(sds((B, T // C, H, K), F32))   # du per chunk, summed below
    out_specs.append(pl.BlockSpec((None, None, None, BK),
                                  lambda ik, n, bh: (bh // H, n, bh % H, ik)))
  kern = functools.partial(_dqkg_kernel, scale=st.scale, exclusive=st.exclusive)
  dq, dk, dg, *du = call(kern, (K // BK, T // C, B * H), [tile] * 2 + gate_specs
                         + [full, full, state, state], out_specs, outs, interpret=st.interpret,
                         warps=st.cfg.warps_dqkg, stages=st.cfg.stages_chunk)(q, k, *gates, v, do,
                                                                               h, dh)
  return dq, dk, dg, (jnp.sum(du[0], axis=(0, 1)) if du else None)


# --- custom_vjp on padded, chunk-aligned inputs ---------------------------------------------------

def _state(k, v, g, h0, starts, ends, st: _Static):
  """(h, final state, G, Gq): Gq is None for GLA and the exclusive cumsum G - g for RWKV-6."""
  cfg = st.cfg
  h, ht, G = state_pass(k, v, g, h0, starts, ends, varlen_=st.varlen, interpret=st.interpret,
                        bv=cfg.bv_state, warps=cfg.warps_state, stages=cfg.stages_state)
  return h, ht, G, (G - g if st.exclusive else None)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _gla(st: _Static, q, k, v, g, u, h0, starts, ends):
  return _gla_fwd(st, q, k, v, g, u, h0, starts, ends)[0]


def _gla_fwd(st, q, k, v, g, u, h0, starts, ends):
  h, ht, G, Gq = _state(k, v, g, h0, starts, ends, st)
  o, A = _output(q, k, v, G, Gq, u, h, st)
  return (o, ht), (q, k, v, g, u, h0, A, starts, ends)


def _gla_bwd(st, res, cts):
  q, k, v, g, u, h0, A, starts, ends = res
  do, dht = cts
  do = do.astype(q.dtype)
  h, _, G, Gq = _state(k, v, g, h0, starts, ends, st)
  cfg = st.cfg
  dh, dv, dh0 = dh_pass(q, k, G, Gq, A, do, dht.astype(F32), starts, ends, scale=st.scale,
                        varlen_=st.varlen, interpret=st.interpret, bv=cfg.bv_state,
                        warps=cfg.warps_state, stages=cfg.stages_state)
  dq, dk, dg, du = _dqkg(q, k, v, G, Gq, u, do, h, dh, st)
  return dq, dk, dv, dg, du, dh0, None, None


_gla.defvjp(_gla_fwd, _gla_bwd)


def run_chunk(q, k, v, g, u=None, *, scale, initial_state, cu_seqlens=None, interpret=False,
              config: Config = DEFAULT):
  """The kernels' entry for GLA and, with the bonus u [H, K], RWKV-6 (o_t reads S_{t-1}).

  Pads K and V to powers of two, T to whole chunks (or re-packs cu_seqlens chunk-aligned), runs the
  custom_vjp kernels and undoes the padding. Shapes as `chunk_gla`.
  """
  reason = unsupported(q, k, v, g)
  if reason:
    raise ValueError(f"the Pallas GPU kernels cannot run these inputs: {reason}; use backend='xla'")
  B, T, H, K = q.shape
  V, dt, C = v.shape[-1], q.dtype, CHUNK
  Kp, Vp = next_pow2(K), next_pow2(V)
  k, v, g = k.astype(dt), v.astype(dt), g.astype(F32)

  layout = None
  if cu_seqlens is not None:
    layout = varlen.chunk_layout(cu_seqlens, T, C)
    q, k, v, g = (varlen.pack(x, layout) for x in (q, k, v, g))
    starts, ends = layout.segments
  else:
    q, k, v, g = (pad_axis(x, 1, -(-T // C) * C) for x in (q, k, v, g))
    starts = ends = jnp.zeros((1,), jnp.int32)
  q, k, g = (pad_axis(x, 3, Kp) for x in (q, k, g))
  v = pad_axis(v, 3, Vp)
  h0 = pad_axis(pad_axis(initial_state, 2, Kp), 3, Vp)
  if u is not None:
    u = pad_axis(u.astype(F32), 1, Kp)
  st = _Static(float(scale), cu_seqlens is not None, bool(interpret), config, u is not None)
  o, S = _gla(st, q, k, v, g, u, h0, starts, ends)
  o = o[..., :V]
  o = o[:, :T] if layout is None else varlen.unpack(o, layout)
  return o, S[:, :, :K, :V]


def chunk_gla(q, k, v, g, *, scale, initial_state, cu_seqlens=None, interpret=False,
              config: Config = DEFAULT):
  """q, k [B, T, H, K]; v [B, T, H, V]; g [B, T, H, K] log decays.

  Returns (o [B, T, H, V] in q.dtype, final_state [N, H, K, V] float32), like xla.py.
  """
  return run_chunk(q, k, v, g, scale=scale, initial_state=initial_state, cu_seqlens=cu_seqlens,
                   interpret=interpret, config=config)


# --- token by token (decode) ----------------------------------------------------------------------

def _recurrent_kernel(*refs, scale, varlen_, H, bonus):
  """S = diag(exp(g_t)) S + k_t v_t^T, o_t = S^T (scale q_t); with the bonus u (RWKV-6) o_t reads
  S_{t-1} + diag(u) k_t v_t^T instead. A float32 [K, BV] state tile per program."""
  refs = list(refs)
  cu_ref = refs.pop(0) if varlen_ else None
  u_ref = refs.pop(4) if bonus else None
  q_ref, k_ref, v_ref, g_ref, h0_ref, o_ref, ht_ref = refs

  def body(t, S):
    q, k, v = (r[t, :].astype(F32) for r in (q_ref, k_ref, v_ref))
    kv = k[:, None] * v[None, :]
    S_next = S * jnp.exp(g_ref[t, :])[:, None] + kv
    read = S + u_ref[...][:, None] * kv if bonus else S_next
    o_ref[t, :] = jnp.sum(read * (q * scale)[:, None], axis=0).astype(o_ref.dtype)
    return S_next

  if varlen_:
    n = pl.program_id(0) // H
    lo, hi = cu_ref[n], cu_ref[n + 1]
  else:
    lo, hi = 0, q_ref.shape[0]
  ht_ref[...] = lax.fori_loop(lo, hi, body, h0_ref[...].astype(F32))


def _recurrent_forward(q, k, v, g, u, h0, cu_seqlens, *, scale, interpret, bv=32, warps=4):
  """Padded inputs (K, V powers of two); g [B, T, H, K] float32; u None or [H, K] float32.
  Grid (N * H, V / BV): each program walks the tokens of one sequence (cu_seqlens: B == 1)."""
  B, T, H, K = q.shape
  V, N = v.shape[-1], h0.shape[0]
  BV = min(bv, V)
  varlen_ = cu_seqlens is not None
  seq = (lambda nh: 0) if varlen_ else (lambda nh: nh // H)  # the batch row of program nh
  tok = lambda D, tiled: pl.BlockSpec((None, T, None, D),
                                      lambda nh, iv: (seq(nh), 0, nh % H, iv if tiled else 0))
  state = pl.BlockSpec((None, None, K, BV), lambda nh, iv: (nh // H, nh % H, 0, iv))
  in_specs = [tok(K, False), tok(K, False), tok(BV, True), tok(K, False), state]
  args = [q, k, v, g, h0]
  if u is not None:
    in_specs.insert(4, pl.BlockSpec((None, K), lambda nh, iv: (nh % H, 0)))
    args.insert(4, u)
  if varlen_:
    in_specs.insert(0, pl.BlockSpec((N + 1,), lambda nh, iv: (0,)))
    args.insert(0, cu_seqlens.astype(jnp.int32))
  kern = functools.partial(_recurrent_kernel, scale=scale, varlen_=varlen_, H=H,
                           bonus=u is not None)
  return call(kern, (N * H, V // BV), in_specs, [tok(BV, True), state],
              [sds(v.shape, q.dtype), sds(h0.shape, F32)], interpret=interpret, warps=warps,
              stages=1)(*args)


@functools.partial(jax.custom_vjp, nondiff_argnums=(7,))
def _recurrent(q, k, v, g, u, h0, cu_seqlens, static):
  scale, interpret = static
  K, V = q.shape[-1], v.shape[-1]
  Kp, Vp = next_pow2(K), next_pow2(V)
  pad_k = lambda x: pad_axis(x, 3, Kp)
  o, S = _recurrent_forward(pad_k(q), pad_k(k.astype(q.dtype)), pad_axis(v.astype(q.dtype), 3, Vp),
                            pad_k(g.astype(F32)),
                            None if u is None else pad_axis(u.astype(F32), 1, Kp),
                            pad_axis(pad_axis(h0, 2, Kp), 3, Vp), cu_seqlens, scale=scale,
                            interpret=interpret)
  return o[..., :V], S[:, :, :K, :V]


def _recurrent_fwd(q, k, v, g, u, h0, cu_seqlens, static):
  return _recurrent(q, k, v, g, u, h0, cu_seqlens, static), (q, k, v, g, u, h0, cu_seqlens)


def _recurrent_bwd(static, res, cts):
  """The gradient of the float32 reference recurrence (decoding needs none; training runs the
  chunked kernels)."""
  q, k, v, g, u, h0, cu_seqlens = res
  f = lambda q, k, v, g, u, h0: reference.fused_recurrent_gla(
      q, k, v, g, scale=static[0], initial_state=h0, cu_seqlens=cu_seqlens, u=u)
  _, vjp = jax.vjp(f, q, k, v, g, u, h0)
  return (*vjp(cts), None)


_recurrent.defvjp(_recurrent_fwd, _recurrent_bwd)


def recurrent(q, k, v, g, u=None, *, scale, initial_state, cu_seqlens=None, interpret=False):
  """GLA (or with u, RWKV-6) token by token. Shapes as `fused_recurrent_gla`; u [H, K]."""
  return _recurrent(q, k, v, g, u, initial_state, cu_seqlens, (float(scale), bool(interpret)))


def fused_recurrent_gla(q, k, v, g, *, scale, initial_state, cu_seqlens=None, interpret=False):
  """Token by token (decode): one launch reads each state once and writes it once. Shapes as
  `chunk_gla`."""
  return recurrent(q, k, v, g, scale=scale, initial_state=initial_state, cu_seqlens=cu_seqlens,
                   interpret=interpret)
