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
gate array's rank), so the scalar path compiles to the code it always had. Per-channel decays do not
factor out of q k^T, so that path takes the intra-chunk scores P precomputed (`scores`) and q and k
already gated, scale exp(G) q and exp(G_C - G) k (the family's chunk-parallel kernel forms all
three), so its serial chunk loop does no exps but the [K] row exp(G_C). With `want_o` the pass writes o and the final state (the forward),
and with `keep_h` also the chunk-start states h (GLA keeps them for its backward); without `want_o`
it writes h and, for the delta rule, v' (the backward recomputes them instead of the forward
storing them).
"""
from __future__ import annotations

import functools

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from pallas_kernels.common.gpu import chunk_o
from pallas_kernels.common.gpu.config import (CHUNK, Static, split_output, state_key_block,
                                              state_stages)
from pallas_kernels.common.gpu.kernel_math import (F32, chunk_gates, decay, decay_state, dot, dot_nt,
                                                   dot_tn, key_blocks, precision, scale_rows,
                                                   state_at_flag, store_at_flag, total)
from pallas_kernels.common.gpu.layout import Specs, launch, sds, value_tile


def _state_kernel(*refs, NT, scale, is_varlen, want_o, want_h, want_final, delta, given_scores, bk):
  """Forward chunk loop. want_o: write o; want_h: h (the chunk-start states); without want_o,
  (delta) v'; want_final (always with want_o): the final state. Without delta there is no w and
  v' = u = v.
  Per-channel gates (g_ref [T, K]): q and k arrive gated and P (given_scores, with want_o) is read,
  not computed. The state is a list of [bk, BV] blocks of its key rows (`kernel_math.key_blocks`)."""
  refs = list(refs)
  q_ref = refs.pop(0) if want_o else None
  k_ref = refs.pop(0)
  w_ref = refs.pop(0) if delta else None
  u_ref, g_ref = refs[:2]
  p_ref = refs.pop(2) if given_scores else None
  h0_ref = refs[2]
  refs = refs[3:]
  starts_ref, ends_ref = (refs.pop(0), refs.pop(0)) if is_varlen else (None, None)
  if want_final and is_varlen:
    refs.pop(0)  # the final-state buffer's initial content (aliased to fin_ref)
  o_ref = refs.pop(0) if want_o else None
  h_ref = refs.pop(0) if want_h else None
  vn_ref = refs.pop(0) if delta and not want_o else None
  fin_ref = refs.pop(0) if want_final else None
  C = CHUNK
  dt = k_ref.dtype
  prec = precision(dt)
  K, BV = h0_ref.shape[-2:]
  rows = key_blocks(K, bk)

  def body(c, S):
    t0 = pl.multiple_of(c * C, C)
    sl = pl.ds(t0, C)
    if is_varlen:
      S = state_at_flag(starts_ref, c, h0_ref, S, rows)
    if want_h:
      for r, s in zip(rows, S):
        h_ref[c, r, :] = s.astype(h_ref.dtype)
    per_channel = len(g_ref.shape) == 2
    if per_channel:
      g_last = [g_ref[t0 + C - 1, r] for r in rows]
    else:
      G, g_last = chunk_gates(g_ref, t0, C)
    ks = [k_ref[sl, r] for r in rows]
    if delta:
      vn_c = (u_ref[sl, :].astype(F32)
              - total([dot(w_ref[sl, r], s.astype(dt), prec) for r, s in zip(rows, S)])).astype(dt)
    else:
      vn_c = u_ref[sl, :]
    if want_o and per_channel:
      qS = total([dot(q_ref[sl, r], s.astype(dt), prec) for r, s in zip(rows, S)])
      o = qS + dot(p_ref[sl, :], vn_c, prec)
      o_ref[sl, :] = o.astype(o_ref.dtype)
    elif want_o:
      qs = [q_ref[sl, r] for r in rows]
      P = total([dot_nt(q, k, prec) for q, k in zip(qs, ks)]) * (decay(G) * scale)
      qS = total([dot(scale_rows(q, jnp.exp(G) * scale, dt), s.astype(dt), prec)
                  for q, s in zip(qs, S)])
      o = qS + dot(P.astype(dt), vn_c, prec)
      o_ref[sl, :] = o.astype(o_ref.dtype)
    elif delta:
      vn_ref[sl, :] = vn_c
    if len(rows) > 1:  # loaded again for the update, not held live through the step's other dots
      ks = [k_ref[sl, r] for r in rows]
    if per_channel:
      S = [decay_state(s, gl) + dot_tn(k, vn_c, prec) for s, gl, k in zip(S, g_last, ks)]
    else:
      S = [s * jnp.exp(g_last) + dot_tn(scale_rows(k, jnp.exp(g_last - G), dt), vn_c, prec)
           for s, k in zip(S, ks)]
    if is_varlen and want_final:
      store_at_flag(ends_ref, c, fin_ref, S, rows)
    return S

  if is_varlen:
    S0 = [jnp.zeros((r.size, BV), F32) for r in rows]
  else:
    S0 = [h0_ref[r, :].astype(F32) for r in rows]
  S = lax.fori_loop(0, NT, body, S0)
  if want_final and not is_varlen:
    for r, s in zip(rows, S):
      fin_ref[r, :] = s


def state_pass(q, k, w, u, G, h0, starts, ends, st: Static, want_o: bool, scores=None,
               keep_h: bool = False):
  """Padded, chunk-aligned inputs: q, k, w [B, T, H, K] (q only with want_o; w None without the
  delta correction), u [B, T, H, V] (v' before the correction: v itself without it), G the
  chunk-local cumsums, [B, H, T] (scalar gates) or [B, T, H, K] (per-channel gates: then q and k
  come gated, scale exp(G) q and exp(G_C - G) k, and with want_o `scores` P [B, T, H, C], row t
  token t's scale q_t k_j^T exp(G_t - G_j) over its chunk, zero for j > t, all in the input
  dtype), h0 [N, H, K, V] float32, starts/ends the varlen flags per chunk.

  want_o: returns (o [B, T, H, V], final_state [N, H, K, V] float32, h [B, NT, H, K, V] with
  keep_h, else None); else (h, v' [B, T, H, V] or None without delta), in the input dtype. With
  want_o and `split_output` (above K = 128 by default) the loop writes h, v' and the final state
  and chunk_o.output_pass forms o.
  """
  delta = w is not None
  if want_o and split_output(st.cfg, k.shape[-1], G.ndim == 4):
    outs = _run_state_pass(None, k, w, u, G, h0, starts, ends, st, False, False, True, None)
    vn = outs[1] if delta else u
    o = chunk_o.output_pass(q, k, G, outs[0], vn, st)
    return o, outs[-1], (outs[0] if keep_h else None)
  outs = _run_state_pass(q, k, w, u, G, h0, starts, ends, st, want_o, keep_h, False, scores)
  if want_o:
    o, *h, final = outs
    return o, final, (h[0] if keep_h else None)
  return outs[0], (outs[1] if delta else None)


def _run_state_pass(q, k, w, u, G, h0, starts, ends, st: Static, want_o: bool, keep_h: bool,
                    want_final: bool, scores):
  """One launch of _state_kernel, its outputs: want_o (o, h with keep_h, final state); else h,
  then v' (delta) and the final state (want_final) where present."""
  B, T, H, K = k.shape
  V, N = u.shape[-1], h0.shape[0]
  BV = value_tile(V, st.cfg.bv_state)
  delta = w is not None
  per_channel = G.ndim == 4
  given_scores = want_o and per_channel
  want_final = want_final or want_o
  if given_scores and scores is None:
    raise ValueError("per-channel gates need the intra-chunk `scores` for the output")
  sp = Specs(H, CHUNK, T)
  kern = functools.partial(_state_kernel, NT=sp.NT, scale=st.scale, is_varlen=st.is_varlen,
                           want_o=want_o, want_h=keep_h or not want_o, want_final=want_final,
                           delta=delta,
                           given_scores=given_scores, bk=state_key_block(st.cfg, K, per_channel))
  h0_spec = sp.seq_h0(K, BV, N if st.is_varlen else None)
  keys = ([q] if want_o else []) + [k] + ([w] if delta else [])
  args = keys + [u, G] + ([scores] if given_scores else []) + [h0]
  in_specs = ([sp.seq_tok(K)] * len(keys)
              + [sp.seq_tok(BV, True), sp.seq_gate(K if per_channel else None)]
              + [sp.seq_tok(CHUNK)] * given_scores + [h0_spec])
  aliases = None
  if st.is_varlen:
    args += [starts, ends]
    in_specs += [sp.seq_flags()] * 2
  if want_o:
    out_specs = [sp.seq_tok(BV, True)] + [sp.seq_state(K, BV)] * keep_h
    out_shape = [sds((B, T, H, V), k.dtype)] + [sds((B, sp.NT, H, K, V), k.dtype)] * keep_h
  else:
    out_specs = [sp.seq_state(K, BV), sp.seq_tok(BV, True)][:1 + delta]
    out_shape = [sds((B, sp.NT, H, K, V), k.dtype), sds((B, T, H, V), k.dtype)][:1 + delta]
  if want_final:
    if st.is_varlen:  # sequences with no tokens keep their initial state
      aliases = {len(args): len(out_specs)}
      args.append(h0)
      in_specs.append(h0_spec)
    out_specs.append(h0_spec)
    out_shape.append(sds(h0.shape, F32))
  return launch(kern, (V // BV, B * H), in_specs, out_specs, out_shape, st, st.cfg.warps_state,
                state_stages(st.cfg, K, per_channel), aliases)(*args)
