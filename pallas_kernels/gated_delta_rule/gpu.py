"""Gated delta rule as Pallas GPU kernels (Triton lowering), with a custom_vjp.

The math is xla.py's chunked WY/UT form (README.md); here each stage is a kernel:

forward
  1. `_wy_fwd`     grid (NT, B*H), in 16-row blocks: A = strict(beta k k^T exp(G_i - G_j)),
                   T = (I + A)^-1 (float32: 16x16 diagonal blocks by a product form, then merges;
                   stored in the input dtype for the backward, as fla does), w = T (beta exp(G) k),
                   u = T (beta v).
  2. `_state_pass` grid (V/BV, B*H): the chunk loop, float32 state [K, BV] in registers, output fused:
                   v' = u - w S;  o = scale exp(G) q S + P v';  S = exp(G_C) S + (exp(G_C - G) k)^T v'
                   with P = lower(scale q k^T exp(G_i - G_j)).
backward (residuals: the inputs, w, u and T; states are recomputed, never stored by the forward)
  3. `_state_pass` again, storing the chunk-start states h [B, NT, H, K, V] and v' in the input dtype.
  4. `_dh_pass`    grid (V/BV, B*H), chunks in reverse: dh (the state gradient at each chunk end),
                   dv' = P^T do + exp(G_C - G) k dh,  dh <- exp(G_C) dh + (scale exp(G) q)^T do - w^T dv'.
  5. `_bwd_dqkw`   grid (K/BK, NT, B*H): dq, the P- and state-parts of dk, dw = -dv' h^T, and dG.
  6. `_bwd_wy`     grid (NT, B*H): back through w, u and T (dA = -T^T dT T^T): dk, dv, dbeta and the
                   rest of dG; dg is the reverse chunk-local cumsum of dG.
The tile axis comes first in the grids of 2-5: Triton launches axis 0 fastest, so the programs that
read the same keys (one head, one chunk) run side by side and share them through L2.

Without beta (`run_chunk(..., beta=None)`) the same kernels run S_t = exp(g_t) S_{t-1} + k_t v_t^T
(simple GLA, pallas_kernels/simple_gla/gpu.py): no WY kernel, w = 0 and v' = u = v.

Supported: any B, T, H; K and V up to 256 (zero-padded to powers of two >= 16 outside the kernels);
bf16, f16 and f32 inputs; scalar gates (or none: the delta rule); initial_state, final state and
cu_seqlens (re-packed chunk-aligned by common.varlen). Per-channel gates (KDA) are not: `unsupported`
says why, and dispatch falls back to xla. Matmul operands are in the input dtype with a float32
accumulator; the state, the gates and the inverse are float32.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from pallas_kernels.common import gpu_recurrent, varlen
from pallas_kernels.common.gpu_utils import (F32, Specs, at_last, chunk_cumsum, compiler_params,
                                             SUB, block_unit_lower_inverse, decay, dot, dot_nt,
                                             dot_tn, head_major, lower_mask, next_pow2, pad_axis,
                                             precision, scale_rows)
from pallas_kernels.gated_delta_rule import reference

CHUNK = 64
MAX_DIM = 256
DTYPES = (jnp.bfloat16, jnp.float16, jnp.float32)


class Config(NamedTuple):
  """Tile sizes and launch parameters (benchmarks/ops.py times variants)."""
  bv_state: int = 32      # value tile of the state passes (forward and reverse)
  warps_state: int = 4
  stages_state: int = 2
  warps_wy: int = 2       # forward WY/UT kernel (2 beat 4 by 10% on the forward, 8 lost: NOTES.md v3)
  bk_dqkw: int = 64       # key tile (grid axis) of the dq/dk/dw kernel
  warps_dqkw: int = 4
  warps_wy_bwd: int = 8
  stages_chunk: int = 1   # chunk-parallel kernels
  bv_chunk: int = 64      # value tile of the loops inside the backward chunk kernels


DEFAULT = Config()


class _Static(NamedTuple):
  scale: float
  varlen: bool
  interpret: bool
  cfg: Config
  delta: bool = True  # False: no delta correction (w = 0, u = v): simple GLA's chunk loop


def unsupported(q, k, v, g=None, *_, **__) -> str | None:
  """Why the GPU kernels cannot run these inputs (None when they can): the dispatch `supports` hook."""
  K, V = q.shape[-1], v.shape[-1]
  if g is not None and g.ndim == 4:
    return "per-channel gates [B, T, H, K] have no GPU kernel yet"
  if K > MAX_DIM:
    return f"key head dim K={K} above {MAX_DIM}"
  if q.dtype not in DTYPES:
    return f"dtype {q.dtype} (supported: bfloat16, float16, float32)"
  return None


def _call(kernel, grid, in_specs, out_specs, out_shape, st: _Static, warps, stages, aliases=None):
  return pl.pallas_call(kernel, grid=grid, in_specs=in_specs, out_specs=out_specs,
                        out_shape=out_shape, input_output_aliases=aliases or {},
                        compiler_params=compiler_params(warps, stages), interpret=st.interpret)


def _sds(shape, dtype):
  return jax.ShapeDtypeStruct(shape, dtype)


# --- 1. WY/UT transform ---------------------------------------------------------------------------

def _wy_fwd_kernel(k_ref, v_ref, g_ref, b_ref, w_ref, u_ref, t_ref):
  """Everything in 16-row blocks: A's blocks, their inverse (T, stored for the backward), w and u."""
  n = CHUNK // SUB
  rows = [pl.ds(p * SUB, SUB) for p in range(n)]
  dt = k_ref.dtype
  prec = precision(dt)
  ks = [k_ref[r, :] for r in rows]
  Gs = [g_ref[r] for r in rows]
  bs = [b_ref[r] for r in rows]
  A = [[None] * n for _ in range(n)]
  for p in range(n):
    for q in range(p + 1):
      L = decay(Gs[p], strict=True) if p == q else jnp.exp(Gs[p][:, None] - Gs[q][None, :])
      A[p][q] = dot_nt(ks[p], ks[q], prec) * L * bs[p][:, None]
  T = block_unit_lower_inverse(A, prec)
  kb = [scale_rows(ks[q], bs[q] * jnp.exp(Gs[q]), dt) for q in range(n)]
  vb = [scale_rows(v_ref[rows[q], :], bs[q], dt) for q in range(n)]
  for p in range(n):
    Tp = [T[p][q].astype(dt) for q in range(p + 1)]
    for q in range(n):
      t_ref[rows[p], rows[q]] = Tp[q] if q <= p else jnp.zeros((SUB, SUB), dt)
    w_ref[rows[p], :] = sum(dot(Tp[q], kb[q], prec) for q in range(p + 1)).astype(w_ref.dtype)
    u_ref[rows[p], :] = sum(dot(Tp[q], vb[q], prec) for q in range(p + 1)).astype(u_ref.dtype)


def _wy_fwd(k, v, G, beta, st: _Static):
  """Returns w [B, T, H, K], u [B, T, H, V] and the chunk inverses T [B, T, H, C] (input dtype)."""
  B, T, H, K = k.shape
  V = v.shape[-1]
  sp = Specs(H, CHUNK, T)
  return _call(_wy_fwd_kernel, (sp.NT, B * H),
               [sp.chunk_tok(K), sp.chunk_tok(V), sp.chunk_gate(), sp.chunk_gate()],
               [sp.chunk_tok(K), sp.chunk_tok(V), sp.chunk_tok(CHUNK)],
               [_sds(k.shape, k.dtype), _sds(v.shape, k.dtype), _sds((B, T, H, CHUNK), k.dtype)], st,
               st.cfg.warps_wy, st.cfg.stages_chunk)(k, v, G, beta)


# --- 2./3. forward state pass ---------------------------------------------------------------------

def _state_kernel(*refs, NT, scale, varlen_, want_o, delta):
  """Forward chunk loop. want_o: write o and the final state; else write h (chunk-start states) and
  (delta) v'. Without delta there is no w and v' = u = v."""
  refs = list(refs)
  q_ref = refs.pop(0) if want_o else None
  k_ref = refs.pop(0)
  w_ref = refs.pop(0) if delta else None
  u_ref, g_ref, h0_ref = refs[:3]
  refs = refs[3:]
  st_ref, en_ref = (refs.pop(0), refs.pop(0)) if varlen_ else (None, None)
  if want_o:
    if varlen_:
      refs.pop(0)  # the final-state buffer's initial content (aliased to fin_ref)
    o_ref, fin_ref = refs
  else:
    h_ref, vn_ref = refs if delta else (refs[0], None)
  C = CHUNK
  dt = k_ref.dtype
  prec = precision(dt)

  def body(c, S):
    t0 = pl.multiple_of(c * C, C)
    sl = pl.ds(t0, C)
    if varlen_:
      s = st_ref[c]
      S = lax.cond(s >= 0, lambda: h0_ref[jnp.maximum(s, 0)].astype(F32), lambda: S)
    if not want_o:
      h_ref[c] = S.astype(h_ref.dtype)
    G, g_last = g_ref[sl], g_ref[t0 + C - 1]
    k = k_ref[sl, :]
    if delta:
      vn_c = (u_ref[sl, :].astype(F32) - dot(w_ref[sl, :], S.astype(dt), prec)).astype(dt)
    else:
      vn_c = u_ref[sl, :]
    if want_o:
      q = q_ref[sl, :]
      P = dot_nt(q, k, prec) * (decay(G) * scale)
      o = dot(scale_rows(q, jnp.exp(G) * scale, dt), S.astype(dt), prec) + dot(P.astype(dt), vn_c, prec)
      o_ref[sl, :] = o.astype(o_ref.dtype)
    elif delta:
      vn_ref[sl, :] = vn_c
    S = S * jnp.exp(g_last) + dot_tn(scale_rows(k, jnp.exp(g_last - G), dt), vn_c, prec)
    if varlen_ and want_o:
      e = en_ref[c]

      @pl.when(e >= 0)
      def _():
        fin_ref[jnp.maximum(e, 0)] = S
    return S

  S0 = jnp.zeros(h0_ref.shape[-2:], F32) if varlen_ else h0_ref[...].astype(F32)
  S = lax.fori_loop(0, NT, body, S0)
  if want_o and not varlen_:
    fin_ref[...] = S


def _state_pass(q, k, w, u, G, h0, starts, ends, st: _Static, want_o: bool):
  """want_o: (o, final_state); else (h [B, NT, H, K, V], v' [B, T, H, V] (delta only)), input dtype."""
  B, T, H, K = k.shape
  V, N = u.shape[-1], h0.shape[0]
  BV = min(st.cfg.bv_state, V)
  sp = Specs(H, CHUNK, T)
  kern = functools.partial(_state_kernel, NT=sp.NT, scale=st.scale, varlen_=st.varlen, want_o=want_o,
                           delta=st.delta)
  h0_spec = sp.seq_h0(K, BV, N if st.varlen else None)
  keys = ([q] if want_o else []) + [k] + ([w] if st.delta else [])
  args = keys + [u, G, h0]
  in_specs = [sp.seq_tok(K)] * len(keys) + [sp.seq_tok(BV, True), sp.seq_gate(), h0_spec]
  aliases = None
  if st.varlen:
    args += [starts, ends]
    in_specs += [sp.seq_flags()] * 2
  if want_o:
    if st.varlen:  # sequences with no tokens keep their initial state
      aliases = {len(args): 1}
      args.append(h0)
      in_specs.append(h0_spec)
    out_specs = [sp.seq_tok(BV, True), h0_spec]
    out_shape = [_sds((B, T, H, V), k.dtype), _sds(h0.shape, F32)]
  else:
    out_specs = [sp.seq_state(K, BV), sp.seq_tok(BV, True)][:1 + st.delta]
    out_shape = [_sds((B, sp.NT, H, K, V), k.dtype), _sds((B, T, H, V), k.dtype)][:1 + st.delta]
  return _call(kern, (V // BV, B * H), in_specs, out_specs, out_shape, st, st.cfg.warps_state,
               st.cfg.stages_state, aliases)(*args)


# --- 4. reverse state-gradient pass ---------------------------------------------------------------

def _dh_kernel(*refs, NT, scale, varlen_, delta):
  refs = list(refs)
  q_ref, k_ref = refs[:2]
  w_ref = refs.pop(2) if delta else None
  do_ref, g_ref, dht_ref = refs[2:5]
  refs = refs[5:]
  if varlen_:
    st_ref, en_ref, _ = refs[:3]
    refs = refs[3:]
  dh_ref, dvn_ref, dh0_ref = refs
  C = CHUNK
  dt = k_ref.dtype
  prec = precision(dt)

  def body(i, dS):
    c = NT - 1 - i
    t0 = pl.multiple_of(c * C, C)
    sl = pl.ds(t0, C)
    if varlen_:
      e = en_ref[c]
      dS = lax.cond(e >= 0, lambda: dht_ref[jnp.maximum(e, 0)].astype(F32), lambda: dS)
    dh_ref[c] = dS.astype(dh_ref.dtype)
    G, g_last = g_ref[sl], g_ref[t0 + C - 1]
    q, k, do = q_ref[sl, :], k_ref[sl, :], do_ref[sl, :]
    P = dot_nt(q, k, prec) * (decay(G) * scale)
    dvn = dot_tn(P.astype(dt), do, prec) + dot(scale_rows(k, jnp.exp(g_last - G), dt), dS.astype(dt), prec)
    dvn_c = dvn.astype(dt)
    dvn_ref[sl, :] = dvn_c
    dS = dS * jnp.exp(g_last) + dot_tn(scale_rows(q, jnp.exp(G) * scale, dt), do, prec)
    if delta:
      dS -= dot_tn(w_ref[sl, :], dvn_c, prec)
    if varlen_:
      s = st_ref[c]

      @pl.when(s >= 0)
      def _():
        dh0_ref[jnp.maximum(s, 0)] = dS
    return dS

  dS0 = jnp.zeros(dht_ref.shape[-2:], F32) if varlen_ else dht_ref[...].astype(F32)
  dS = lax.fori_loop(0, NT, body, dS0)
  if not varlen_:
    dh0_ref[...] = dS


def _dh_pass(q, k, w, do, G, dht, starts, ends, st: _Static):
  """Returns dh [B, NT, H, K, V], dv' [B, T, H, V] (input dtype) and d initial_state (float32).
  w is None without delta."""
  B, T, H, K = k.shape
  V, N = do.shape[-1], dht.shape[0]
  BV = min(st.cfg.bv_state, V)
  sp = Specs(H, CHUNK, T)
  h0_spec = sp.seq_h0(K, BV, N if st.varlen else None)
  keys = [q, k] + ([w] if st.delta else [])
  args = keys + [do, G, dht]
  in_specs = [sp.seq_tok(K)] * len(keys) + [sp.seq_tok(BV, True), sp.seq_gate(), h0_spec]
  aliases = None
  if st.varlen:  # sequences with no tokens pass the final-state gradient straight through
    args += [starts, ends, dht]
    in_specs += [sp.seq_flags()] * 2 + [h0_spec]
    aliases = {len(args) - 1: 2}
  kern = functools.partial(_dh_kernel, NT=sp.NT, scale=st.scale, varlen_=st.varlen, delta=st.delta)
  return _call(kern, (V // BV, B * H), in_specs,
               [sp.seq_state(K, BV), sp.seq_tok(BV, True), h0_spec],
               [_sds((B, sp.NT, H, K, V), k.dtype), _sds(do.shape, k.dtype), _sds(dht.shape, F32)],
               st, st.cfg.warps_state, st.cfg.stages_state, aliases)(*args)


# --- 5. dq, dk (attention and state parts), dw ----------------------------------------------------

def _bwd_dqkw_kernel(qt_ref, kt_ref, g_ref, h_ref, dh_ref, do_ref, vn_ref, dvn_ref, *out_refs,
                     scale, bv):
  """One chunk and one key tile (qt, kt, h, dh hold that tile of the key axis). Outputs dq, dk, dG
  and, with delta (four outputs), dw."""
  dq_ref, dk_ref, dg_ref = out_refs[:3]
  delta = len(out_refs) == 4
  C = CHUNK
  qt, kt, G = qt_ref[...], kt_ref[...], g_ref[...]
  g_last = g_ref[C - 1]
  dt = qt.dtype
  prec = precision(dt)
  BK, V = h_ref.shape
  dP = jnp.zeros((C, C), F32)
  dq1 = dks = dw = jnp.zeros((C, BK), F32)
  hdh = jnp.zeros((), F32)
  for j in range(V // bv):
    vs = pl.ds(j * bv, bv)
    h, dh, do, vn, dvn = (r[:, vs] for r in (h_ref, dh_ref, do_ref, vn_ref, dvn_ref))
    dP += dot_nt(do, vn, prec)
    dq1 += dot_nt(do, h, prec)
    dks += dot_nt(vn, dh, prec)
    if delta:
      dw += dot_nt(dvn, h, prec)
    hdh += jnp.sum(h.astype(F32) * dh.astype(F32))
  dq_state = scale_rows(dq1, jnp.exp(G) * scale)
  dQK = dP * (decay(G) * scale)                      # gradient of the scores q k^T
  dq = dq_state + dot(dQK.astype(dt), kt, prec)
  dk_state = scale_rows(dks, jnp.exp(g_last - G))
  dk = dot_tn(dQK.astype(dt), qt, prec) + dk_state
  Z = dQK * dot_nt(qt, kt, prec)                     # this key tile's share of dP * P
  z = jnp.sum(dk_state * kt.astype(F32), axis=1)
  dG = jnp.sum(dq_state * qt.astype(F32), axis=1) + jnp.sum(Z, axis=1) - jnp.sum(Z, axis=0) - z
  dg_ref[...] = at_last(dG, jnp.sum(z) + jnp.exp(g_last) * hdh)
  dq_ref[...] = dq.astype(dq_ref.dtype)
  dk_ref[...] = dk.astype(dk_ref.dtype)
  if delta:
    out_refs[3][...] = (-dw).astype(out_refs[3].dtype)


def _bwd_dqkw(q, k, G, h, dh, do, vn, dvn, st: _Static):
  """dq, dk (float32 with delta: the WY part is added later; else the input dtype), dG [B, H, T]
  (summed over key tiles) and, with delta, dw."""
  B, T, H, K = q.shape
  V = do.shape[-1]
  BK = min(st.cfg.bk_dqkw, K)
  NK = K // BK
  C = CHUNK
  kern = functools.partial(_bwd_dqkw_kernel, scale=st.scale, bv=min(st.cfg.bv_chunk, V))
  tok = lambda D, tile: pl.BlockSpec((None, C, None, D), lambda ik, n, bh: (bh // H, n, bh % H, ik if tile else 0))
  state = pl.BlockSpec((None, None, None, BK, V), lambda ik, n, bh: (bh // H, n, bh % H, ik, 0))
  gate = pl.BlockSpec((None, None, C), lambda ik, n, bh: (bh // H, bh % H, n))
  dgate = pl.BlockSpec((None, None, None, C), lambda ik, n, bh: (ik, bh // H, bh % H, n))
  outs = [(tok(BK, True), _sds(q.shape, q.dtype)), (tok(BK, True), _sds(q.shape, F32 if st.delta else q.dtype)),
          (dgate, _sds((NK, *G.shape), F32))] + [(tok(BK, True), _sds(q.shape, q.dtype))] * st.delta
  dq, dk, dG, *dw = _call(kern, (NK, T // C, B * H),
                          [tok(BK, True)] * 2 + [gate, state, state] + [tok(V, False)] * 3,
                          [o[0] for o in outs], [o[1] for o in outs],
                          st, st.cfg.warps_dqkw, st.cfg.stages_chunk)(q, k, G, h, dh, do, vn, dvn)
  return dq, dk, jnp.sum(dG, axis=0), (dw[0] if dw else None)


# --- 6. back through the WY/UT transform ----------------------------------------------------------

def _bwd_wy_kernel(k_ref, v_ref, g_ref, b_ref, t_ref, dw_ref, du_ref, dk1_ref, dg1_ref,
                   dk_ref, dv_ref, db_ref, dg_ref, *, bv):
  """w = T (beta exp(G) k), u = T (beta v), T = (I + A)^-1 (the forward's, input dtype)."""
  C = CHUNK
  k, G, beta, Tc = k_ref[...], g_ref[...], b_ref[...], t_ref[...]
  dt = k.dtype
  prec = precision(dt)
  V = v_ref.shape[1]
  dT = jnp.zeros((C, C), F32)
  dbeta = jnp.zeros((C,), F32)
  for j in range(V // bv):
    vs = pl.ds(j * bv, bv)
    du, v = du_ref[:, vs], v_ref[:, vs]
    dvb = dot_tn(Tc, du, prec)                        # T^T du
    dv_ref[:, vs] = scale_rows(dvb, beta).astype(dv_ref.dtype)
    dbeta += jnp.sum(dvb * v.astype(F32), axis=1)
    dT += dot_nt(du, scale_rows(v, beta, dt), prec)
  dw = dw_ref[...]
  be = beta * jnp.exp(G)
  kb = scale_rows(k, be)
  dkb = dot_tn(Tc, dw, prec)                          # T^T dw
  dT += dot_nt(dw, kb.astype(dt), prec)
  dA = -dot_nt(dot_tn(Tc, dT.astype(dt), prec).astype(dt), Tc, prec)  # -T^T dT T^T
  L = decay(G, strict=True)
  KKL = dot_nt(k, k, prec) * L                        # A = diag(beta) KKL
  A = scale_rows(KKL, beta)
  dA = jnp.where(lower_mask(C, strict=True), dA, 0.0)
  M = dA * A
  dbeta += jnp.sum(dkb * k.astype(F32), axis=1) * jnp.exp(G) + jnp.sum(dA * KKL, axis=1)
  dG = dg1_ref[...] + jnp.sum(dkb * kb, axis=1) + jnp.sum(M, axis=1) - jnp.sum(M, axis=0)
  dAk = scale_rows(dA * L, beta, dt)
  dk = dk1_ref[...] + scale_rows(dkb, be) + dot(dAk, k, prec) + dot_tn(dAk, k, prec)
  dk_ref[...] = dk.astype(dk_ref.dtype)
  db_ref[...] = dbeta
  dg_ref[...] = dG


def _bwd_wy(k, v, G, beta, Tinv, dw, du, dk1, dG1, st: _Static):
  B, T, H, K = k.shape
  V = v.shape[-1]
  sp = Specs(H, CHUNK, T)
  kern = functools.partial(_bwd_wy_kernel, bv=min(st.cfg.bv_chunk, V))
  return _call(kern, (sp.NT, B * H),
               [sp.chunk_tok(K), sp.chunk_tok(V), sp.chunk_gate(), sp.chunk_gate(), sp.chunk_tok(CHUNK),
                sp.chunk_tok(K), sp.chunk_tok(V), sp.chunk_tok(K), sp.chunk_gate()],
               [sp.chunk_tok(K), sp.chunk_tok(V), sp.chunk_gate(), sp.chunk_gate()],
               [_sds(k.shape, k.dtype), _sds(v.shape, v.dtype), _sds(G.shape, F32), _sds(G.shape, F32)],
               st, st.cfg.warps_wy_bwd, st.cfg.stages_chunk)(k, v, G, beta, Tinv, dw, du, dk1, dG1)


# --- custom_vjp on padded, chunk-aligned inputs ---------------------------------------------------

@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _gdn(st: _Static, q, k, v, g, beta, h0, starts, ends):
  return _gdn_fwd(st, q, k, v, g, beta, h0, starts, ends)[0]


def _gdn_fwd(st, q, k, v, g, beta, h0, starts, ends):
  G = chunk_cumsum(g, CHUNK)
  w, u, Tinv = _wy_fwd(k, v, G, beta, st) if st.delta else (None, v, None)
  o, ht = _state_pass(q, k, w, u, G, h0, starts, ends, st, want_o=True)
  return (o, ht), (q, k, v, G, beta, h0, w, u, Tinv, starts, ends)


def _gdn_bwd(st, res, cts):
  q, k, v, G, beta, h0, w, u, Tinv, starts, ends = res
  do, dht = cts
  do = do.astype(q.dtype)
  h, *vn = _state_pass(None, k, w, u, G, h0, starts, ends, st, want_o=False)
  vn = vn[0] if st.delta else v
  dh, dvn, dh0 = _dh_pass(q, k, w, do, G, dht.astype(F32), starts, ends, st)
  dq, dk, dG, dw = _bwd_dqkw(q, k, G, h, dh, do, vn, dvn, st)
  if st.delta:
    dk, dv, dbeta, dG = _bwd_wy(k, v, G, beta, Tinv, dw, dvn, dk, dG, st)
  else:
    dv, dbeta = dvn, None
  dg = chunk_cumsum(dG, CHUNK, reverse=True)
  return dq, dk, dv, dg, dbeta, dh0, None, None


_gdn.defvjp(_gdn_fwd, _gdn_bwd)


def chunk_gated_delta_rule(q, k, v, g, beta, *, scale, initial_state=None, cu_seqlens=None,
                           interpret=False, config: Config = DEFAULT):
  """q, k [B, T, H, K]; v [B, T, H, V]; g None or [B, T, H] (log decays); beta [B, T, H].

  Returns (o [B, T, H, V] in q.dtype, final_state [N, H, K, V] float32), like xla.py.
  """
  return run_chunk(q, k, v, g, beta, scale=scale, initial_state=initial_state, cu_seqlens=cu_seqlens,
                   interpret=interpret, config=config)


def fused_recurrent_gated_delta_rule(q, k, v, g, beta, *, scale, initial_state=None,
                                     cu_seqlens=None, interpret=False):
  """Token by token (decode): common/gpu_recurrent.py. Shapes as `chunk_gated_delta_rule`."""
  return gpu_recurrent.fused_recurrent(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                                       cu_seqlens=cu_seqlens, interpret=interpret,
                                       reference=reference.fused_recurrent_gated_delta_rule)


def run_chunk(q, k, v, g, beta, *, scale, initial_state=None, cu_seqlens=None, interpret=False,
              config: Config = DEFAULT):
  """The kernels' entry for every family: the gated delta rule, or with beta None the same chunk
  loop without the delta correction, S_t = exp(g_t) S_{t-1} + k_t v_t^T (simple GLA).

  Pads K and V to powers of two, T to whole chunks (or re-packs cu_seqlens chunk-aligned), runs the
  custom_vjp kernels and undoes the padding. Shapes as `chunk_gated_delta_rule`.
  """
  reason = unsupported(q, k, v, g)
  if reason:
    raise ValueError(f"the Pallas GPU kernels cannot run these inputs: {reason}; use backend='xla'")
  if v.shape[-1] > MAX_DIM:
    # Value columns evolve independently (k, g and beta are shared), so a wide V runs as slices.
    kw = dict(scale=scale, cu_seqlens=cu_seqlens, interpret=interpret, config=config)
    cuts = list(range(MAX_DIM, v.shape[-1], MAX_DIM))
    h0s = [None] * (len(cuts) + 1) if initial_state is None else jnp.split(initial_state, cuts, -1)
    outs = [run_chunk(q, k, v_i, g, beta, initial_state=h_i, **kw)
            for v_i, h_i in zip(jnp.split(v, cuts, -1), h0s)]
    return jnp.concatenate([o for o, _ in outs], -1), jnp.concatenate([s_ for _, s_ in outs], -1)
  B, T, H, K = q.shape
  V, dt, C = v.shape[-1], q.dtype, CHUNK
  Kp, Vp = next_pow2(K), next_pow2(V)
  k, v = k.astype(dt), v.astype(dt)
  g = jnp.zeros((B, T, H), F32) if g is None else g.astype(F32)
  delta = beta is not None
  beta = beta.astype(F32) if delta else jnp.zeros((B, T, H), F32)
  n_seq = B if cu_seqlens is None else cu_seqlens.shape[0] - 1
  h0 = jnp.zeros((n_seq, H, K, V), F32) if initial_state is None else initial_state.astype(F32)

  layout = None
  if cu_seqlens is not None:
    layout = varlen.chunk_layout(cu_seqlens, T, C)
    q, k, v, g, beta = (varlen.pack(x, layout) for x in (q, k, v, g, beta))
    starts, ends = layout.segments
  else:
    q, k, v, g, beta = (pad_axis(x, 1, -(-T // C) * C) for x in (q, k, v, g, beta))
    starts = ends = jnp.zeros((1,), jnp.int32)
  q, k = pad_axis(q, 3, Kp), pad_axis(k, 3, Kp)
  v = pad_axis(v, 3, Vp)
  h0 = pad_axis(pad_axis(h0, 2, Kp), 3, Vp)
  st = _Static(float(scale), cu_seqlens is not None, bool(interpret), config, delta)
  o, S = _gdn(st, q, k, v, head_major(g), head_major(beta) if delta else None, h0, starts, ends)
  o = o[..., :V]
  o = o[:, :T] if layout is None else varlen.unpack(o, layout)
  return o, S[:, :, :K, :V]
