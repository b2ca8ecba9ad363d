"""The chunk-parallel gradient kernel of q and k (like fla's chunk_bwd_dqkwg): grid
(K / BK, NT, B*H), one chunk and one key tile per program, from the chunk-start states h, the
state gradients dh and dv' of the reverse pass:

  dq = scale exp(G) do h^T + dQK k,         dQK = lower(do v'^T) * scale exp(G_i - G_j)
  dk = dQK^T q + exp(G_C - G) v' dh^T
  dG (the gradient of the chunk-local cumsum G: the caller's reverse chunk cumsum gives dg)
  dw = -dv' h^T (the delta rule only: the gradient of w in v' = u - w S)

With per-channel gates (G [C, K], KDA) the kernel computes only the state parts (dq, dk, dw and
their dG, exact per key channel, so dG needs no sum over key tiles): the intra-chunk scores' parts
need the family's sub-chunk factorisation and are added by its own kernel.
"""
from __future__ import annotations

import functools

import jax.numpy as jnp
from jax.experimental import pallas as pl

from pallas_kernels.common.gpu.config import CHUNK, Static
from pallas_kernels.common.gpu.kernel_math import (F32, at_last, decay, dot, dot_nt, dot_tn,
                                                   over_value_tiles, precision, scale_rows)
from pallas_kernels.common.gpu.layout import launch, sds


def _dqk_kernel(qt_ref, kt_ref, g_ref, h_ref, dh_ref, do_ref, vn_ref, dvn_ref, *out_refs, scale,
                bv, unrolled):
  """One chunk and one key tile (qt, kt, h, dh and, per channel, G hold that tile of the key axis).
  Outputs dq, dk, dG and, with delta (four outputs), dw."""
  dq_ref, dk_ref, dg_ref = out_refs[:3]
  delta = len(out_refs) == 4
  per_channel = len(g_ref.shape) == 2
  C = CHUNK
  qt, kt, G = qt_ref[...], kt_ref[...], g_ref[...]
  g_last = g_ref[C - 1, :] if per_channel else g_ref[C - 1]
  dt = qt.dtype
  prec = precision(dt)
  BK, V = h_ref.shape

  def value_tile(vs, acc):  # the sums over V; everything after them is done once per program
    dP, dq1, dks, dw, hdh = acc
    h, dh, do, vn, dvn = (r[:, vs] for r in (h_ref, dh_ref, do_ref, vn_ref, dvn_ref))
    if not per_channel:
      dP += dot_nt(do, vn, prec)
    dq1 += dot_nt(do, h, prec)
    dks += dot_nt(vn, dh, prec)
    if delta:
      dw += dot_nt(dvn, h, prec)
    hdh += jnp.sum(h.astype(F32) * dh.astype(F32), axis=1 if per_channel else None)
    return dP, dq1, dks, dw, hdh

  tiles = jnp.zeros((C, BK), F32)
  dP, dq1, dks, dw, hdh = over_value_tiles(
      V, bv, unrolled, value_tile,
      (jnp.zeros((C, C), F32), tiles, tiles, tiles, jnp.zeros((BK,) if per_channel else (), F32)))
  if per_channel:
    dq = dq1 * (jnp.exp(G) * scale)
    dk = dks * jnp.exp(g_last[None, :] - G)
    kdk = kt.astype(F32) * dk
    dg_ref[...] = at_last(qt.astype(F32) * dq - kdk, jnp.sum(kdk, axis=0) + jnp.exp(g_last) * hdh)
    dq_ref[...] = dq.astype(dq_ref.dtype)
    dk_ref[...] = dk.astype(dk_ref.dtype)
    if delta:
      out_refs[3][...] = (-dw).astype(out_refs[3].dtype)
    return
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


def dqk_pass(q, k, G, h, dh, do, vn, dvn, st: Static, want_dw: bool):
  """Padded inputs: q, k [B, T, H, K], G [B, H, T] (scalar gates) or [B, T, H, K] (per-channel),
  h and dh [B, NT, H, K, V], do, v' and dv' [B, T, H, V]. Returns dq, dk, dG (float32, G's shape;
  scalar gates: summed over key tiles) and dw (None unless want_dw). With want_dw (the delta rule)
  dk is float32, since the WY backward adds its part, and with per-channel gates dq too (the
  intra-chunk parts are added by the family's kernel); else they are in the input dtype.

  Per-channel gates: dq, dk and dG hold the state parts only (see the module docstring)."""
  B, T, H, K = q.shape
  V = do.shape[-1]
  BK = min(st.cfg.bk_dqkw, K)
  NK = K // BK
  C = CHUNK
  per_channel = G.ndim == 4
  kern = functools.partial(_dqk_kernel, scale=st.scale, bv=min(st.cfg.bv_chunk, V),
                           unrolled=st.cfg.unrolled_value_columns)
  tok = lambda D, tile: pl.BlockSpec((None, C, None, D),
                                     lambda ik, n, bh: (bh // H, n, bh % H, ik if tile else 0))
  state = pl.BlockSpec((None, None, None, BK, V), lambda ik, n, bh: (bh // H, n, bh % H, ik, 0))
  if per_channel:
    gate = dgate = tok(BK, True)
    dG_shape = G.shape
  else:
    gate = pl.BlockSpec((None, None, C), lambda ik, n, bh: (bh // H, bh % H, n))
    dgate = pl.BlockSpec((None, None, None, C), lambda ik, n, bh: (ik, bh // H, bh % H, n))
    dG_shape = (NK, *G.shape)
  outs = [(tok(BK, True), sds(q.shape, F32 if per_channel else q.dtype)),
          (tok(BK, True), sds(q.shape, F32 if want_dw else q.dtype)),
          (dgate, sds(dG_shape, F32))] + [(tok(BK, True), sds(q.shape, q.dtype))] * want_dw
  dq, dk, dG, *dw = launch(kern, (NK, T // C, B * H),
                           [tok(BK, True)] * 2 + [gate, state, state] + [tok(V, False)] * 3,
                           [o[0] for o in outs], [o[1] for o in outs],
                           st, st.cfg.warps_dqkw, st.cfg.stages_chunk)(q, k, G, h, dh, do, vn, dvn)
  return dq, dk, (dG if per_channel else jnp.sum(dG, axis=0)), (dw[0] if dw else None)
