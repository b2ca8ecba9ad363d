"""The forward chunk state pass (like fla's chunk_h / chunk_delta_h with chunk_o fused in, or, with
`config.split_output`, followed by common/gpu/chunk_o.py's chunk-parallel output kernel): grid
(V / BV, B*H), the chunks in a `lax.fori_loop`, the float32 state [K, BV] in registers (as blocks of
Config.bk_state key rows, every product over K split alike).

  v' = u - w S  (delta rule only; else v' = u = v)
  o  = scale exp(G) q S + P v',  P = lower(scale q k^T exp(G_i - G_j))
  S <- exp(G_C) S + (exp(G_C - G) k)^T v'

G is the chunk-local cumsum of the log decays: a scalar per head and token (G [C], head-major gate
layout [B, H, T]), or per key channel (G [C, K], token layout [B, T, H, K]: KDA), where exp(G) and
exp(G_C - G) scale q and k entry by entry and exp(G_C) the state's rows. Which one is static (the
gate array's rank: KDA, GLA and RWKV-6 per channel). Per-channel decays do not factor out of q k^T,
so that path takes the intra-chunk scores P precomputed (`scores`) and q and k already gated,
scale exp(G) q and exp(G_C - G) k (the family's chunk-parallel kernel forms all three), so its
serial chunk loop does no exps but the [K] row exp(G_C). Each gate kind has its step functions
(`_scalar_output` / `_per_channel_output`, `_scalar_update` / `_per_channel_update`).
With `want_o` the pass writes o and the final state (the forward), and with `keep_h` also the
chunk-start states h and, for the delta rule, v' (what the backward reads: GLA keeps h always, the
other families with `Config.keep_states`); without `want_o` it writes h and v' (the backward forms
them again instead of the forward storing them).
"""
from __future__ import annotations

import functools

import jax.numpy as jnp
from jax.experimental import pallas as pl

from pallas_kernels.common.gpu import chunk_o
from pallas_kernels.common.gpu.config import (CHUNK, Static, split_output, state_key_block,
                                              state_stages, state_value_block)
from pallas_kernels.common.gpu.kernel_math import (F32, chunk_gates, decay_state, dot, dot_tn,
                                                   intra_chunk_scores, key_blocks, precision,
                                                   scale_rows,
                                                   read_blocks, state_at_flag, store_at_flag,
                                                   total, walk_chunks, write_blocks)
from pallas_kernels.common.gpu.layout import Specs, launch, sds, spec_if, value_tile


def _scalar_output(q_ref, sl, rows, ks, S, vn_c, G, scale, dt, prec):
  """o of a chunk with scalar gates: scale exp(G) q S + P v', P formed here."""
  qs = [q_ref[sl, r] for r in rows]
  P = intra_chunk_scores(qs, ks, G, scale, prec)
  qS = total([dot(scale_rows(q, jnp.exp(G) * scale, dt), s.astype(dt), prec)
              for q, s in zip(qs, S)])
  return qS + dot(P.astype(dt), vn_c, prec)


def _per_channel_output(q_ref, p_ref, sl, rows, S, vn_c, dt, prec):
  """o of a chunk with per-channel gates: q arrives gated, P is read."""
  qS = total([dot(q_ref[sl, r], s.astype(dt), prec) for r, s in zip(rows, S)])
  return qS + dot(p_ref[sl, :], vn_c, prec)


def _scalar_update(S, ks, vn_c, G, g_last, dt, prec):
  """S <- exp(G_C) S + (exp(G_C - G) k)^T v'."""
  return [s * jnp.exp(g_last) + dot_tn(scale_rows(k, jnp.exp(g_last - G), dt), vn_c, prec)
          for s, k in zip(S, ks)]


def _per_channel_update(S, ks, vn_c, g_last, prec):
  """S <- diag(exp(G_C)) S + k^T v', k arriving gated."""
  return [decay_state(s, gl) + dot_tn(k, vn_c, prec) for s, gl, k in zip(S, g_last, ks)]


def _state_kernel(q_ref, k_ref, w_ref, u_ref, g_ref, p_ref, h0_ref, starts_ref, ends_ref,
                  o_ref, h_ref, vn_ref, fin_ref, *, NT, scale, bk):
  """Forward chunk loop over the state S, a list of [bk, BV] blocks of its key rows
  (`kernel_math.key_blocks`). Absent refs are None: q_ref and o_ref without the output; w_ref
  without the delta correction (then v' = u = v), vn_ref unless v' is stored; p_ref unless
  per-channel gates (g_ref [T, K]: q and k arrive gated) give the output; h_ref unless the
  chunk-start states are stored; fin_ref without the final state; starts_ref and ends_ref without
  varlen."""
  C = CHUNK
  dt = k_ref.dtype
  prec = precision(dt)
  rows = key_blocks(h0_ref.shape[-2], bk)
  per_channel, is_varlen = len(g_ref.shape) == 2, starts_ref is not None

  def body(c, S):
    t0 = pl.multiple_of(c * C, C)
    sl = pl.ds(t0, C)
    if is_varlen:
      S = state_at_flag(starts_ref[c], read_blocks(h0_ref, rows), S)
    if h_ref is not None:
      for r, s in zip(rows, S):
        h_ref[c, r, :] = s.astype(h_ref.dtype)
    if per_channel:
      g_last = [g_ref[t0 + C - 1, r] for r in rows]
    else:
      G, g_last = chunk_gates(g_ref, t0, C)
    ks = [k_ref[sl, r] for r in rows]
    vn_c = u_ref[sl, :]
    if w_ref is not None:
      vn_c = (vn_c.astype(F32)
              - total([dot(w_ref[sl, r], s.astype(dt), prec) for r, s in zip(rows, S)])).astype(dt)
    if o_ref is not None:
      o = (_per_channel_output(q_ref, p_ref, sl, rows, S, vn_c, dt, prec) if per_channel
           else _scalar_output(q_ref, sl, rows, ks, S, vn_c, G, scale, dt, prec))
      o_ref[sl, :] = o.astype(o_ref.dtype)
    if vn_ref is not None:
      vn_ref[sl, :] = vn_c
    if len(rows) > 1:  # loaded again for the update, not held live through the step's other dots
      ks = [k_ref[sl, r] for r in rows]
    S = (_per_channel_update(S, ks, vn_c, g_last, prec) if per_channel
         else _scalar_update(S, ks, vn_c, G, g_last, dt, prec))
    if is_varlen and fin_ref is not None:
      store_at_flag(ends_ref[c], write_blocks(fin_ref, rows, S))
    return S

  walk_chunks(NT, body, h0_ref, fin_ref, rows, is_varlen)


def state_pass(q, k, w, u, G, h0, starts, ends, st: Static, want_o: bool, scores=None,
               keep_h: bool = False):
  """Padded, chunk-aligned inputs: q, k, w [B, T, H, K] (q only with want_o; w None without the
  delta correction), u [B, T, H, V] (v' before the correction: v itself without it), G the
  chunk-local cumsums, [B, H, T] (scalar gates) or [B, T, H, K] (per-channel gates: then q and k
  come gated, scale exp(G) q and exp(G_C - G) k, and with want_o `scores` P [B, T, H, C], row t
  token t's scale q_t k_j^T exp(G_t - G_j) over its chunk, zero for j > t, all in the input
  dtype), h0 [N, H, K, V] float32, starts/ends the varlen flags per chunk.

  want_o: returns (o [B, T, H, V], final_state [N, H, K, V] float32, kept), kept None unless
  keep_h, else (h [B, NT, H, K, V], v' [B, T, H, V] or None without delta): what the call without
  want_o returns, in the input dtype. With want_o and `split_output` (above K = 128 by default) the
  loop writes h, v' and the final state and chunk_o.output_pass forms o, so keeping them is free.
  """
  delta = w is not None
  if want_o and split_output(st.cfg, k.shape[-1], G.ndim == 4):
    h, *vn, final = _run_state_pass(None, k, w, u, G, h0, starts, ends, st, False, False, True,
                                    None)
    vn = vn[0] if delta else None
    o = chunk_o.output_pass(q, k, G, h, u if vn is None else vn, st)
    return o, final, ((h, vn) if keep_h else None)
  outs = _run_state_pass(q, k, w, u, G, h0, starts, ends, st, want_o, keep_h, False, scores)
  if want_o:
    o, *kept, final = outs
    return o, final, ((kept[0], kept[1] if delta else None) if keep_h else None)
  return outs[0], (outs[1] if delta else None)


def _run_state_pass(q, k, w, u, G, h0, starts, ends, st: Static, want_o: bool, keep_h: bool,
                    want_final: bool, scores):
  """One launch of _state_kernel, its outputs: want_o (o, then h and v' (delta) with keep_h, the
  final state); else h, then v' (delta) and the final state (want_final) where present."""
  B, T, H, K = k.shape
  V, N = u.shape[-1], h0.shape[0]
  delta = w is not None
  per_channel = G.ndim == 4
  BV = value_tile(V, state_value_block(st.cfg, B, H, K, V, per_channel, st.is_varlen))
  want_final = want_final or want_o
  if want_o and per_channel and scores is None:
    raise ValueError("per-channel gates need the intra-chunk `scores` for the output")
  sp = Specs(H, CHUNK, T)
  h0_spec = sp.seq_h0(K, BV, N if st.is_varlen else None)
  scores = scores if want_o and per_channel else None
  q = q if want_o else None
  flags = (starts, ends) if st.is_varlen else (None, None)
  args = [q, k, w, u, G, scores, h0, *flags]
  in_specs = [spec_if(q, sp.seq_tok(K)), sp.seq_tok(K), spec_if(w, sp.seq_tok(K)),
              sp.seq_tok(BV, True),
              sp.seq_gate(K if per_channel else None), spec_if(scores, sp.seq_tok(CHUNK)), h0_spec,
              *(spec_if(f, sp.seq_flags()) for f in flags)]
  tokens, states = sds((B, T, H, V), k.dtype), sds((B, sp.NT, H, K, V), k.dtype)
  out_shape = [tokens if want_o else None, states if keep_h or not want_o else None,
               tokens if delta and (keep_h or not want_o) else None,
               sds(h0.shape, F32) if want_final else None]
  out_specs = [spec_if(x, spec) for x, spec in zip(out_shape, [sp.seq_tok(BV, True),
                                                             sp.seq_state(K, BV),
                                                             sp.seq_tok(BV, True), h0_spec])]
  kern = functools.partial(_state_kernel, NT=sp.NT, scale=st.scale,
                           bk=state_key_block(st.cfg, K, per_channel))
  results = launch(kern, (V // BV, B * H), in_specs, out_specs, out_shape, st, st.cfg.warps_state,
                   state_stages(st.cfg, K, per_channel))(*args)
  return [r for r in results if r is not None]
