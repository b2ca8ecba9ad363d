"""Gated delta rule as Pallas GPU kernels (Triton lowering), with its custom_vjp.

The math is xla.py's chunked WY/UT form (README.md). This module holds the delta rule's own
kernels, the WY/UT transform forward and backward; the state passes and the dq/dk kernel are
family-free stages in pallas_kernels/common/gpu/ (its docstring gives the house rule):

forward
  1. `_wy_fwd`                  grid (NT, B*H), in 16-row blocks:
                                A = strict(beta k k^T exp(G_i - G_j)), T = (I + A)^-1 (float32:
                                16x16 diagonal blocks by a product form, then merges; stored in
                                the input dtype for the backward, as fla does),
                                w = T (beta exp(G) k), u = T (beta v).
  2. `chunk_state.state_pass`   grid (V/BV, B*H): the chunk loop, float32 state [K, BV] in
                                registers, output fused: v' = u - w S;
                                o = scale exp(G) q S + P v';  S = exp(G_C) S + (exp(G_C - G) k)^T v'
                                with P = lower(scale q k^T exp(G_i - G_j)). Above K = 128
                                (`config.split_output`) the pass writes h, v' and the final state
                                instead and `chunk_o.output_pass` (grid (V/BV, NT, B*H)) forms o.
backward (residuals: the inputs, T and, up to K = 128, w and u (`keeps_w_u`); the states are
formed again in the backward unless `Config.keep_states` keeps the forward's h, v', w and u)
  3. `_wy_apply`                above K = 128: w and u again from T (grid (NT, B*H)); then
     `chunk_state.state_pass`   again, storing the chunk-start states h [B, NT, H, K, V] and v' in
                                the input dtype.
  4. `chunk_dh.dh_pass`         grid (V/BV, B*H), chunks in reverse (above K = 128 after P^T do
                                in a chunk-parallel kernel, grid (NT, B*H)): dh (the state
                                gradient at each chunk end), dv' = P^T do + exp(G_C - G) k dh,
                                dh <- exp(G_C) dh + (scale exp(G) q)^T do - w^T dv'.
  5. `chunk_dqk.dqk_pass`       grid (K/BK, NT, B*H): dq, the P- and state-parts of dk,
                                dw = -dv' h^T, and dG.
  6. `_bwd_wy`                  grid (NT, B*H): back through w, u and T (dA = -T^T dT T^T): dk, dv,
                                dbeta and the rest of dG; dg is the reverse chunk-local cumsum
                                of dG.
The tile axis comes first in the grids of 2-5: Triton launches axis 0 fastest, so the programs that
read the same keys (one head, one chunk) run side by side and share them through L2. Any V runs in
one launch of each kernel: the state passes (2-4) take more value tiles on their grid, the chunk
kernels (1, 5, 6) loop over them (`kernel_math.over_value_tiles`) beside their V-independent work
(T and w; the q/k side of dq, dk and of 6), which is thus done once at any V.

Supported: any B, T, H; K up to 256 and any V (zero-padded to powers of two >= 16 outside the
kernels, a V above 256 to a multiple of 128); bf16, f16 and f32 inputs; scalar gates (or none: the
delta rule); initial_state, final state and cu_seqlens (re-packed chunk-aligned by common.varlen),
all through common/gpu/layout.py's `run_chunked`. Per-channel gates are KDA's (kda/gpu.py: its own
WY kernels on the same stages). Matmul operands are in the input dtype with a float32 accumulator; the
state, the gates and the inverse are float32.
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from pallas_kernels.common.gpu import chunk_dh, chunk_dqk, chunk_state, layout
from pallas_kernels.common.gpu.config import CHUNK, DEFAULT, Config, Static
from pallas_kernels.common.gpu.fused_recurrent import fused_recurrent
from pallas_kernels.common.gpu.kernel_math import (F32, SUB, block_unit_lower_inverse, decay, dot,
                                                   dot_nt, dot_tn, key_blocks, lower_mask,
                                                   over_value_tiles, precision, scale_rows, total)
from pallas_kernels.common.gpu.layout import Specs, chunk_cumsum, launch, run_chunked, sds
from pallas_kernels.gated_delta_rule import reference

unsupported = layout.unsupported  # the dispatch `supports` hook: reason or None


# --- 1. WY/UT transform ---------------------------------------------------------------------------

def _wy_fwd_kernel(k_ref, v_ref, g_ref, b_ref, w_ref, u_ref, t_ref, *, bk, unrolled):
  """A = strict-lower(beta k k^T exp(G_i - G_j)) formed whole ([C, C]: one product per key tile of
  bk), then in 16-row blocks: its inverse (T, stored for the backward), w and u. Compiled for
  sm_90a (`gpu_aot`), A formed whole against its ten 16 x 16 blocks a key tile: at K = 256,
  V = 512 7.2 against 10.7 s, 255 registers and 60 bytes of spills a thread either way; at K = V
  = 128 5.0 against 6.4 s, 194 registers and no spills against 255 and 4 bytes."""
  n = CHUNK // SUB
  rows = [pl.ds(p * SUB, SUB) for p in range(n)]
  dt = k_ref.dtype
  prec = precision(dt)
  Gs = [g_ref[r] for r in rows]
  bs = [b_ref[r] for r in rows]
  KK = total([dot_nt(k_ref[:, kt], k_ref[:, kt], prec) for kt in key_blocks(k_ref.shape[1], bk)])
  A_full = KK * decay(g_ref[...], strict=True) * b_ref[...][:, None]
  A = [jnp.split(a, n, axis=1) for a in jnp.split(A_full, n, axis=0)]
  T = block_unit_lower_inverse(A, prec)
  Ts = [[T[p][q].astype(dt) for q in range(p + 1)] for p in range(n)]
  for p in range(n):
    for q in range(n):
      t_ref[rows[p], rows[q]] = Ts[p][q] if q <= p else jnp.zeros((SUB, SUB), dt)
  _write_w_u(Ts, Gs, bs, k_ref, v_ref, w_ref, u_ref, unrolled)


def _write_w_u(Ts, Gs, bs, k_ref, v_ref, w_ref, u_ref, unrolled, bv=128):
  """w = T (beta exp(G) k) and u = T (beta v) from the inverse's blocks Ts."""
  write_inverse_product(Ts, [b * jnp.exp(G) for b, G in zip(bs, Gs)], k_ref, w_ref, unrolled, bv)
  write_inverse_product(Ts, bs, v_ref, u_ref, unrolled, bv)


def _wy_apply_kernel(k_ref, v_ref, g_ref, b_ref, t_ref, w_ref, u_ref, *, unrolled):
  """w and u again from the forward's inverse T (input dtype, as the forward formed them from), as
  one [C, C] block: one product per column tile of 64 where 16-row blocks take ten. Compiled for
  sm_90a at K = 256, V = 512 (`gpu_aot`): 188 registers, no spills, 1.9 s, against 255, 60 bytes
  a thread and 2.4 s in 16-row blocks (84 bytes at column tiles of 128)."""
  _write_w_u([[t_ref[...]]], [g_ref[...]], [b_ref[...]], k_ref, v_ref, w_ref, u_ref, unrolled,
             bv=64)


def write_inverse_product(Ts, scales, x_ref, out_ref, unrolled: int, bv: int = 128):
  """out = T diag(scales) x in row blocks (Ts[p][q] the inverse's blocks of C / len(Ts) rows,
  input dtype; scales the rows' factors, a [C / len(Ts)] vector a block) and column tiles of at
  most bv (their loop unrolled up to `unrolled` columns): u = T (beta v) and w = T (beta exp(G) k).
  At V = 256 (the context-parallel call carries the K x K transition as K extra value columns) one
  tile spilled 861 KiB a thread at the forward WY kernel's 2 warps and took ptxas 39 s; w formed
  whole at K = 256 spilled 680 bytes. KDA's forward WY kernel shares it."""
  dt = Ts[0][0].dtype
  prec = precision(dt)
  size = x_ref.shape[0] // len(Ts)
  rows = [pl.ds(p * size, size) for p in range(len(Ts))]
  D = x_ref.shape[1]

  def tile(cols, carry):
    xs = [scale_rows(x_ref[r, cols], scales[q], dt) for q, r in enumerate(rows)]
    for p, r in enumerate(rows):
      out_ref[r, cols] = sum(dot(Ts[p][q], xs[q], prec) for q in range(p + 1)).astype(out_ref.dtype)
    return carry

  over_value_tiles(D, math.gcd(D, bv), unrolled, tile)


def _wy_fwd(k, v, G, beta, st: Static):
  """Returns w [B, T, H, K], u [B, T, H, V] and the chunk inverses T [B, T, H, C] (input dtype)."""
  B, T, H, K = k.shape
  V = v.shape[-1]
  sp = Specs(H, CHUNK, T)
  # k k^T over key tiles of 64 (gpu_aot at K = 256: 68 bytes of spills a thread at tiles of 128,
  # 60 at 64, 56 at 32 in 9.0 s of compile against 7.2)
  kern = functools.partial(_wy_fwd_kernel, bk=min(K, 64), unrolled=st.cfg.unrolled_value_columns)
  return launch(kern, (sp.NT, B * H),
               [sp.chunk_tok(K), sp.chunk_tok(V), sp.chunk_gate(), sp.chunk_gate()],
               [sp.chunk_tok(K), sp.chunk_tok(V), sp.chunk_tok(CHUNK)],
               [sds(k.shape, k.dtype), sds(v.shape, k.dtype), sds((B, T, H, CHUNK), k.dtype)], st,
               st.cfg.warps_wy, st.cfg.stages_chunk)(k, v, G, beta)


def _wy_apply(k, v, G, beta, Tinv, st: Static):
  """w [B, T, H, K] and u [B, T, H, V] from the forward's chunk inverses T [B, T, H, C]."""
  B, T, H, K = k.shape
  V = v.shape[-1]
  sp = Specs(H, CHUNK, T)
  kern = functools.partial(_wy_apply_kernel, unrolled=st.cfg.unrolled_value_columns)
  return launch(kern, (sp.NT, B * H),
               [sp.chunk_tok(K), sp.chunk_tok(V), sp.chunk_gate(), sp.chunk_gate(), sp.chunk_tok(CHUNK)],
               [sp.chunk_tok(K), sp.chunk_tok(V)],
               [sds(k.shape, k.dtype), sds(v.shape, k.dtype)], st,
               st.cfg.warps_wy, st.cfg.stages_chunk)(k, v, G, beta, Tinv)


def keeps_w_u(cfg, K: int) -> bool:
  """Whether the forward keeps w [T, K] and u [T, V] for the backward, or only the inverse T
  [T, C], from which the backward forms them again (`_wy_apply`, as fla's recompute_w_u). Up to
  K = 128 it keeps them; above, it keeps T alone: at the 475M model's K = 256, V = 512, w and u
  are 201 MB a layer at 32,768 tokens, 4.8 GB over its 24 layers, where the step's peak stood
  1.9 GiB above fla's. Forming them again reads k, v and T and writes w and u (no inverse).
  `cfg.keep_wu` overrides; `cfg.keep_states` (the backward forms nothing again) keeps them."""
  if cfg.keep_wu is not None:
    return bool(cfg.keep_wu)
  return K <= 128 or cfg.keep_states


# --- 6. back through the WY/UT transform ----------------------------------------------------------

def back_through_u(Tc, beta, v_ref, du_ref, dv_ref, bv, unrolled):
  """Back through u = T (beta v) in value tiles of bv (T the chunk's inverse, input dtype): writes
  dv = beta T^T du and returns T's gradient du (beta v)^T and beta's, sum_v (T^T du) v (float32).
  KDA's WY backward shares it."""
  C = CHUNK
  dt = Tc.dtype
  prec = precision(dt)

  def value_tile(vs, acc):
    dT, dbeta = acc
    du, v = du_ref[:, vs], v_ref[:, vs]
    dvb = dot_tn(Tc, du, prec)                        # T^T du
    dv_ref[:, vs] = scale_rows(dvb, beta).astype(dv_ref.dtype)
    dbeta = dbeta + jnp.sum(dvb * v.astype(F32), axis=1)
    return dT + dot_nt(du, scale_rows(v, beta, dt), prec), dbeta

  return over_value_tiles(v_ref.shape[1], bv, unrolled, value_tile,
                          (jnp.zeros((C, C), F32), jnp.zeros((C,), F32)))


def _bwd_wy_kernel(k_ref, v_ref, g_ref, b_ref, t_ref, dw_ref, du_ref, dk1_ref, dg1_ref,
                   dk_ref, dv_ref, db_ref, dg_ref, *, bv, bk, unrolled):
  """w = T (beta exp(G) k), u = T (beta v), T = (I + A)^-1 (the forward's, input dtype). Two
  passes over the keys in tiles of bk (`kernel_math.key_blocks`): the sums over K first (T's
  gradient from w, k k^T, and the row sums of dbeta and dG), then dk tile by tile, T^T dw formed
  again for each tile (kept from the first pass when one tile spans K)."""
  C = CHUNK
  G, beta, Tc = g_ref[...], b_ref[...], t_ref[...]
  dt = k_ref.dtype
  prec = precision(dt)
  keys = key_blocks(k_ref.shape[1], bk)
  dT, dbeta = back_through_u(Tc, beta, v_ref, du_ref, dv_ref, bv, unrolled)
  be = beta * jnp.exp(G)
  KK, dbk, dgk = jnp.zeros((C, C), F32), jnp.zeros((C,), F32), jnp.zeros((C,), F32)
  for r in keys:
    k, dw = k_ref[:, r], dw_ref[:, r]
    kb = scale_rows(k, be)
    dkb = dot_tn(Tc, dw, prec)                        # T^T dw
    dT += dot_nt(dw, kb.astype(dt), prec)
    KK += dot_nt(k, k, prec)
    dbk += jnp.sum(dkb * k.astype(F32), axis=1)
    dgk += jnp.sum(dkb * kb, axis=1)
  dA = -dot_nt(dot_tn(Tc, dT.astype(dt), prec).astype(dt), Tc, prec)  # -T^T dT T^T
  L = decay(G, strict=True)
  KKL = KK * L                                        # A = diag(beta) KKL
  A = scale_rows(KKL, beta)
  dA = jnp.where(lower_mask(C, strict=True), dA, 0.0)
  M = dA * A
  db_ref[...] = dbeta + dbk * jnp.exp(G) + jnp.sum(dA * KKL, axis=1)
  dg_ref[...] = dg1_ref[...] + dgk + jnp.sum(M, axis=1) - jnp.sum(M, axis=0)
  dAk = scale_rows(dA * L, beta, dt)
  for r in keys:
    k = k_ref[:, r]
    if len(keys) > 1:
      dkb = dot_tn(Tc, dw_ref[:, r], prec)
    dk = dk1_ref[:, r] + scale_rows(dkb, be) + dot(dAk, k, prec) + dot_tn(dAk, k, prec)
    dk_ref[:, r] = dk.astype(dk_ref.dtype)


def wy_bwd_key_block(cfg, K: int) -> int:
  """Keys per tile of the WY backward's loops: the whole K up to 128 (the anchor's tuning), tiles
  of 64 above; `cfg.bk_wy_bwd` overrides. Compiled for sm_90a (`gpu_aot`) at K = 256, V = 512,
  8 warps: 255 registers either way; whole, 100 bytes of spills a thread and 104 KiB of shared
  memory; in tiles of 64, 196 bytes and 32 KiB, so two programs share an SM. Timed on an H100
  (GDN fwd+bwd, H=4 K=256 V=512 bf16): tiles of 64 against the whole K, 7.40 against 7.72 ms at
  B=1 T=32,768; 4.04 against 4.37 at B=8 T=4,096 with the dh pass at two stages."""
  if cfg.bk_wy_bwd is not None:
    return cfg.bk_wy_bwd
  return 64 if K > 128 else K


def _bwd_wy(k, v, G, beta, Tinv, dw, du, dk1, dG1, st: Static):
  B, T, H, K = k.shape
  V = v.shape[-1]
  sp = Specs(H, CHUNK, T)
  kern = functools.partial(_bwd_wy_kernel, bv=min(st.cfg.bv_chunk, V),
                           bk=wy_bwd_key_block(st.cfg, K), unrolled=st.cfg.unrolled_value_columns)
  return launch(kern, (sp.NT, B * H),
               [sp.chunk_tok(K), sp.chunk_tok(V), sp.chunk_gate(), sp.chunk_gate(), sp.chunk_tok(CHUNK),
                sp.chunk_tok(K), sp.chunk_tok(V), sp.chunk_tok(K), sp.chunk_gate()],
               [sp.chunk_tok(K), sp.chunk_tok(V), sp.chunk_gate(), sp.chunk_gate()],
               [sds(k.shape, k.dtype), sds(v.shape, v.dtype), sds(G.shape, F32), sds(G.shape, F32)],
               st, st.cfg.warps_wy_bwd,
               st.cfg.stages_chunk if st.cfg.stages_wy_bwd is None else st.cfg.stages_wy_bwd)(
                   k, v, G, beta, Tinv, dw, du, dk1, dG1)


# --- custom_vjp on padded, chunk-aligned inputs ---------------------------------------------------

@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _chunk_gdn(st: Static, q, k, v, g, beta, h0, starts, ends):
  """(o, final state) of padded inputs; g, beta [B, H, T] float32 (layout.run_chunked's `core`)."""
  return _chunk_gdn_fwd(st, q, k, v, g, beta, h0, starts, ends)[0]


def _chunk_gdn_fwd(st, q, k, v, g, beta, h0, starts, ends):
  G = chunk_cumsum(g, CHUNK)
  w, u, Tinv = _wy_fwd(k, v, G, beta, st)
  o, ht, kept = chunk_state.state_pass(q, k, w, u, G, h0, starts, ends, st, want_o=True,
                                       keep_h=st.cfg.keep_states)
  if not keeps_w_u(st.cfg, k.shape[-1]):
    w = u = None
  return (o, ht), (q, k, v, G, beta, h0, w, u, Tinv, kept, starts, ends)


def _chunk_gdn_bwd(st, res, cts):
  q, k, v, G, beta, h0, w, u, Tinv, kept, starts, ends = res
  do, dht = cts
  do = do.astype(q.dtype)
  if w is None:
    w, u = _wy_apply(k, v, G, beta, Tinv, st)
  h, vn = kept or chunk_state.state_pass(None, k, w, u, G, h0, starts, ends, st, want_o=False)
  dh, dvn, dh0 = chunk_dh.dh_pass(q, k, w, do, G, dht.astype(F32), starts, ends, st)
  dq, dk, dG, dw = chunk_dqk.dqk_pass(q, k, G, h, dh, do, vn, dvn, st, want_dw=True)
  dk, dv, dbeta, dG = _bwd_wy(k, v, G, beta, Tinv, dw, dvn, dk, dG, st)
  dg = chunk_cumsum(dG, CHUNK, reverse=True)
  return dq, dk, dv, dg, dbeta, dh0, None, None


_chunk_gdn.defvjp(_chunk_gdn_fwd, _chunk_gdn_bwd)


def chunk_gated_delta_rule(q, k, v, g, beta, *, scale, initial_state, cu_seqlens=None,
                           interpret=False, config: Config = DEFAULT):
  """q, k [B, T, H, K]; v [B, T, H, V]; g None or [B, T, H] (log decays); beta [B, T, H].

  Returns (o [B, T, H, V] in q.dtype, final_state [N, H, K, V] float32), like xla.py.
  """
  return run_chunked(_chunk_gdn, q, k, v, (g, beta), scale=scale, initial_state=initial_state,
                     cu_seqlens=cu_seqlens, interpret=interpret, config=config)


def fused_recurrent_gated_delta_rule(q, k, v, g, beta, *, scale, initial_state,
                                     cu_seqlens=None, interpret=False):
  """Token by token (decode): common/gpu/fused_recurrent.py. Shapes as `chunk_gated_delta_rule`."""
  return fused_recurrent(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                         cu_seqlens=cu_seqlens, interpret=interpret,
                         reference=reference.fused_recurrent_gated_delta_rule)
