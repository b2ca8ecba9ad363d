"""The reverse state-gradient pass (like fla's chunk_gated_delta_rule_bwd_dhu, after its
chunk_bwd_dv_local above K = 128): grid (V / BV, B*H), the chunks in reverse in a `lax.fori_loop`,
the float32 dS [K, BV] in registers (as blocks of Config.bk_state key rows, as in chunk_state.py):

  dh_c = dS (the state gradient at the chunk's end, stored for the dq/dk kernel)
  dv'  = P^T do + exp(G_C - G) k dS
  dS  <- exp(G_C) dS + (scale exp(G) q)^T do  [- w^T dv' for the delta rule]

Scalar gates G [C] or per-channel gates G [C, K] as in chunk_state.py; the per-channel path takes q
and k gated (scale exp(G) q, exp(G_C - G) k) and reads the forward's intra-chunk scores P instead
of forming them. The intra-chunk part P^T do comes from a chunk-parallel kernel, grid (NT, B*H),
where `config.split_dv_local` says so (above K = 128): the pass runs one program per value tile,
and formed there, the [C, C] scores (a K-long product) are recomputed by each of the V / BV
programs of a head, on the critical path of every chunk step (at the 475M GDN's K=256, V=512 the
pass took 4.9 ms a layer at B=1 T=32,768 on an H100, against 2.3 for fla's, which splits it so).
"""
from __future__ import annotations

import functools

import jax.numpy as jnp
from jax.experimental import pallas as pl

from pallas_kernels.common.gpu.config import (CHUNK, Static, split_dv_local, state_key_block,
                                              state_stages, state_value_block)
from pallas_kernels.common.gpu.kernel_math import (F32, chunk_gates, decay_state, dot, dot_tn,
                                                   intra_chunk_scores, key_blocks, over_value_tiles,
                                                   precision, read_blocks, scale_rows,
                                                   state_at_flag, store_at_flag, total, walk_chunks,
                                                   write_blocks)
from pallas_kernels.common.gpu.layout import Specs, launch, sds, spec_if, value_tile


def _dv_local_kernel(q_ref, k_ref, g_ref, p_ref, do_ref, dvl_ref, *, scale, bv, unrolled):
  """P^T do of one chunk, P formed once for every value tile: lower(scale q k^T exp(G_i - G_j))
  with scalar gates, or the forward's scores p_ref (per-channel gates; q_ref, k_ref, g_ref None)."""
  dt = do_ref.dtype
  prec = precision(dt)
  if p_ref is None:
    P = intra_chunk_scores([q_ref[...]], [k_ref[...]], g_ref[...], scale, prec).astype(dt)
  else:
    P = p_ref[...]

  def value_tile(cols, carry):
    dvl_ref[:, cols] = dot_tn(P, do_ref[:, cols], prec).astype(dvl_ref.dtype)
    return carry

  over_value_tiles(dvl_ref.shape[1], bv, unrolled, value_tile)


def dv_local_pass(q, k, G, do, st: Static, scores=None):
  """dv_local = P^T do [B, T, H, V] in the input dtype (as fla keeps it), from padded inputs as
  `dh_pass` takes them."""
  B, T, H, K = k.shape
  V = do.shape[-1]
  sp = Specs(H, CHUNK, T)
  if scores is not None:
    q = k = G = None
  args = [q, k, G, scores, do]
  in_specs = [spec_if(q, sp.chunk_tok(K)), spec_if(k, sp.chunk_tok(K)), spec_if(G, sp.chunk_gate()),
              spec_if(scores, sp.chunk_tok(CHUNK)), sp.chunk_tok(V)]
  kern = functools.partial(_dv_local_kernel, scale=st.scale, bv=min(st.cfg.bv_chunk, V),
                           unrolled=st.cfg.unrolled_value_columns)
  return launch(kern, (sp.NT, B * H), in_specs, sp.chunk_tok(V), sds(do.shape, do.dtype), st,
                st.cfg.warps_output, st.cfg.stages_chunk)(*args)


def _scalar_dh_update(dS, qs, do, G, g_last, scale, dt, prec):
  """dS <- exp(G_C) dS + (scale exp(G) q)^T do."""
  return [s * jnp.exp(g_last) + dot_tn(scale_rows(q, jnp.exp(G) * scale, dt), do, prec)
          for s, q in zip(dS, qs)]


def _per_channel_dh_update(dS, qs, do, g_last, prec):
  """dS <- diag(exp(G_C)) dS + q^T do, q arriving gated."""
  return [decay_state(s, gl) + dot_tn(q, do, prec) for s, gl, q in zip(dS, g_last, qs)]


def _dh_kernel(q_ref, k_ref, w_ref, do_ref, g_ref, p_ref, dvl_ref, dht_ref, starts_ref, ends_ref,
               dh_ref, dvn_ref, dh0_ref, *, NT, scale, bk):
  """Reverse chunk loop, dS a list of [bk, BV] blocks of its key rows (`kernel_math.key_blocks`).
  Absent refs are None: w_ref without the delta correction; dvl_ref (P^T do from `dv_local_pass`)
  unless `split_dv_local`; p_ref (the forward's scores) but with per-channel gates (g_ref [T, K]:
  q and k arrive gated) and no dvl_ref; starts_ref and ends_ref without varlen."""
  C = CHUNK
  dt = k_ref.dtype
  prec = precision(dt)
  rows = key_blocks(dht_ref.shape[-2], bk)
  per_channel, is_varlen = len(g_ref.shape) == 2, starts_ref is not None

  def body(i, dS):
    c = NT - 1 - i
    t0 = pl.multiple_of(c * C, C)
    sl = pl.ds(t0, C)
    if is_varlen:
      dS = state_at_flag(ends_ref[c], read_blocks(dht_ref, rows), dS)
    for r, s in zip(rows, dS):
      dh_ref[c, r, :] = s.astype(dh_ref.dtype)
    qs = None if dvl_ref is not None else [q_ref[sl, r] for r in rows]
    ks, do = [k_ref[sl, r] for r in rows], do_ref[sl, :]
    if per_channel:
      g_last = [g_ref[t0 + C - 1, r] for r in rows]
    else:
      G, g_last = chunk_gates(g_ref, t0, C)
    if dvl_ref is not None:
      dvl = dvl_ref[sl, :].astype(F32)
    elif per_channel:
      dvl = dot_tn(p_ref[sl, :], do, prec)
    else:
      P = intra_chunk_scores(qs, ks, G, scale, prec)
      dvl = dot_tn(P.astype(dt), do, prec)
    if not per_channel:
      ks = [scale_rows(k, jnp.exp(g_last - G), dt) for k in ks]
    dvn = dvl + total([dot(k, s.astype(dt), prec) for k, s in zip(ks, dS)])
    dvn_c = dvn.astype(dt)
    dvn_ref[sl, :] = dvn_c
    if qs is None or len(rows) > 1:  # loaded again, not held live through the step's other dots
      qs = [q_ref[sl, r] for r in rows]
    dS = (_per_channel_dh_update(dS, qs, do, g_last, prec) if per_channel
          else _scalar_dh_update(dS, qs, do, G, g_last, scale, dt, prec))
    if w_ref is not None:
      dS = [s - dot_tn(w_ref[sl, r], dvn_c, prec) for s, r in zip(dS, rows)]
    if is_varlen:
      store_at_flag(starts_ref[c], write_blocks(dh0_ref, rows, dS))
    return dS

  walk_chunks(NT, body, dht_ref, dh0_ref, rows, is_varlen)


def dh_pass(q, k, w, do, G, dht, starts, ends, st: Static, scores=None):
  """Padded inputs as `chunk_state.state_pass` (w None without the delta correction; per-channel
  gates G [B, T, H, K] with q, k gated and the forward's `scores`), do the output gradient, dht
  [N, H, K, V] float32 the final-state gradient. Returns dh [B, NT, H, K, V], dv' [B, T, H, V]
  (input dtype) and d initial_state (float32)."""
  B, T, H, K = k.shape
  V, N = do.shape[-1], dht.shape[0]
  per_channel = G.ndim == 4
  if per_channel and scores is None:
    raise ValueError("per-channel gates need the forward's intra-chunk `scores`")
  scores = scores if per_channel else None
  dvl = None
  if split_dv_local(st.cfg, K):
    dvl, scores = dv_local_pass(q, k, G, do, st, scores), None
  BV = value_tile(V, state_value_block(st.cfg, B, H, K, V, per_channel, st.is_varlen, dh=True))
  sp = Specs(H, CHUNK, T)
  h0_spec = sp.seq_h0(K, BV, N if st.is_varlen else None)
  flags = (starts, ends) if st.is_varlen else (None, None)
  args = [q, k, w, do, G, scores, dvl, dht, *flags]
  in_specs = [sp.seq_tok(K), sp.seq_tok(K), spec_if(w, sp.seq_tok(K)), sp.seq_tok(BV, True),
              sp.seq_gate(K if per_channel else None), spec_if(scores, sp.seq_tok(CHUNK)),
              spec_if(dvl, sp.seq_tok(BV, True)), h0_spec,
              *(spec_if(f, sp.seq_flags()) for f in flags)]
  kern = functools.partial(_dh_kernel, NT=sp.NT, scale=st.scale,
                           bk=state_key_block(st.cfg, K, per_channel))
  return launch(kern, (V // BV, B * H), in_specs,
                [sp.seq_state(K, BV), sp.seq_tok(BV, True), h0_spec],
                [sds((B, sp.NT, H, K, V), k.dtype), sds(do.shape, k.dtype), sds(dht.shape, F32)],
                st, st.cfg.warps_state, state_stages(st.cfg, K, per_channel, dh=True))(*args)
