"""The decode stage: a token-by-token Pallas GPU kernel (Triton lowering) of the scalar- and
per-channel-gate recurrences (like fla's fused_recurrent),

  S_t = diag(exp(g_t)) S_{t-1};  [delta] v_t <- beta_t (v_t - S_t^T k_t);
  S_t += k_t v_t^T;  o_t = S_t^T (scale q_t)
  [bonus u]  o_t = (S_{t-1} + diag(u) k_t v_t^T)^T (scale q_t)

with g_t a scalar (the gated delta rule, the delta rule with g = 0 and, without the delta
correction, simple GLA) or a [K] vector per token (KDA, GLA; RWKV-6 with the bonus u [H, K]).
Grid (N * H, V / BV): each program keeps a float32 [K, BV] state tile in registers and walks the
tokens of its sequence (with cu_seqlens, B == 1: from cu_seqlens[n] to cu_seqlens[n + 1]), so a
decode step is one launch that reads each state once and writes it once. The gradient is the float32
reference recurrence's, recomputed (`jax.vjp` of the family's reference): decoding needs none and
training runs the chunked kernels.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from pallas_kernels.common.gpu.kernel_math import F32, decay_state
from pallas_kernels.common.gpu.layout import call, head_major, next_pow2, pad_axis

BV = 32        # value tile: N * H * V / 32 programs, enough to fill the GPU at decode batch sizes
WARPS = 4


def _kernel(cu_ref, q_ref, k_ref, v_ref, g_ref, b_ref, u_ref, h0_ref, o_ref, ht_ref, *,
            scale: float, H: int):
  """cu_ref (cu_seqlens), b_ref (beta: the delta correction) and u_ref (the bonus) None when
  absent."""

  def body(t, S):
    q, k, v = (r[t, :].astype(F32) for r in (q_ref, k_ref, v_ref))
    S_prev = S
    S = decay_state(S, g_ref[t, :] if len(g_ref.shape) == 2 else g_ref[t])
    if b_ref is not None:
      v = b_ref[t] * (v - jnp.sum(S * k[:, None], axis=0))
    kv = k[:, None] * v[None, :]
    S = S + kv
    read = S if u_ref is None else S_prev + u_ref[...][:, None] * kv
    o_ref[t, :] = jnp.sum(read * (q * scale)[:, None], axis=0).astype(o_ref.dtype)
    return S

  if cu_ref is not None:
    n = pl.program_id(0) // H
    lo, hi = cu_ref[n], cu_ref[n + 1]
  else:
    lo, hi = 0, q_ref.shape[0]
  ht_ref[...] = lax.fori_loop(lo, hi, body, h0_ref[...].astype(F32))


def decode_specs(T, H, K, bv, is_varlen):
  """The block specs of a decode grid (N * H, V / bv), program (nh, iv) walking head nh % H of
  sequence nh // H (with cu_seqlens, B == 1: every program reads row 0): `tok(D, tiled)` a token
  input [B, T, H, D] (tiled: its iv-th bv slice), `row` a per-head gate [B, H, T], `state` the
  [K, bv] tile of a state [N, H, K, V]."""
  seq = (lambda nh: 0) if is_varlen else (lambda nh: nh // H)  # the batch row of program nh
  tok = lambda D, tiled: pl.BlockSpec((None, T, None, D),
                                      lambda nh, iv: (seq(nh), 0, nh % H, iv if tiled else 0))
  row = pl.BlockSpec((None, None, T), lambda nh, iv: (seq(nh), nh % H, 0))
  state = pl.BlockSpec((None, None, K, bv), lambda nh, iv: (nh // H, nh % H, 0, iv))
  return tok, row, state


def _forward(q, k, v, g, beta, u, h0, cu_seqlens, *, scale, interpret):
  """Padded inputs (K, V powers of two); g [B, H, T] or (per channel) [B, T, H, K], beta None or
  [B, H, T], u None or [H, K], float32. Returns (o, final state)."""
  B, T, H, K = q.shape
  V, N = v.shape[-1], h0.shape[0]
  bv = min(BV, V)
  is_varlen = cu_seqlens is not None
  tok, gate, state = decode_specs(T, H, K, bv, is_varlen)
  in_specs = [pl.BlockSpec((N + 1,), lambda nh, iv: (0,)) if is_varlen else None,
              tok(K, False), tok(K, False), tok(bv, True), tok(K, False) if g.ndim == 4 else gate,
              None if beta is None else gate,
              None if u is None else pl.BlockSpec((None, K), lambda nh, iv: (nh % H, 0)), state]
  cu = cu_seqlens.astype(jnp.int32) if is_varlen else None
  # each program walks one sequence: B * T // N tokens on average
  return call(functools.partial(_kernel, scale=scale, H=H), (N * H, V // bv), in_specs,
              [tok(bv, True), state], [jax.ShapeDtypeStruct(v.shape, q.dtype),
                                       jax.ShapeDtypeStruct(h0.shape, F32)],
              interpret=interpret, warps=WARPS, stages=1, loop_trips=B * T // N)(
                  cu, q, k, v, g, beta, u, h0)


@functools.partial(jax.custom_vjp, nondiff_argnums=(8, 9))
def _recurrent(q, k, v, g, beta, u, h0, cu_seqlens, static, reference):
  scale, interpret = static
  B, T, H, K = q.shape
  V = v.shape[-1]
  Kp, Vp = next_pow2(K), next_pow2(V)
  if g is None or g.ndim == 3:
    g_in = head_major(jnp.zeros((B, T, H), F32) if g is None else g)
  else:
    g_in = pad_axis(g.astype(F32), 3, Kp)
  o, S = _forward(pad_axis(q, 3, Kp), pad_axis(k.astype(q.dtype), 3, Kp),
                  pad_axis(v.astype(q.dtype), 3, Vp), g_in,
                  None if beta is None else head_major(beta),
                  None if u is None else pad_axis(u.astype(F32), 1, Kp),
                  pad_axis(pad_axis(h0, 2, Kp), 3, Vp), cu_seqlens, scale=scale,
                  interpret=interpret)
  return o[..., :V], S[:, :, :K, :V]


def _recurrent_fwd(q, k, v, g, beta, u, h0, cu_seqlens, static, reference):
  residuals = (q, k, v, g, beta, u, h0, cu_seqlens)
  return _recurrent(q, k, v, g, beta, u, h0, cu_seqlens, static, reference), residuals


def _recurrent_bwd(static, reference, res, cts):
  q, k, v, g, beta, u, h0, cu_seqlens = res
  f = lambda q, k, v, g, beta, u, h0: reference(q, k, v, g, beta, scale=static[0],
                                                initial_state=h0, cu_seqlens=cu_seqlens,
                                                **({} if u is None else {"u": u}))
  _, vjp = jax.vjp(f, q, k, v, g, beta, u, h0)
  return (*vjp(cts), None)


_recurrent.defvjp(_recurrent_fwd, _recurrent_bwd)


def fused_recurrent(q, k, v, g, beta, *, scale, reference, initial_state, cu_seqlens=None,
                    interpret=False, u=None):
  """q, k [B, T, H, K]; v [B, T, H, V]; g None, [B, T, H] or [B, T, H, K] log decays; beta None
  (no delta correction) or [B, T, H]; u None or the bonus [H, K] (RWKV-6: o_t reads S_{t-1}).
  `reference(q, k, v, g, beta, *, scale, initial_state, cu_seqlens[, u])`: the float32 recurrence
  that defines the gradient (`u` passed only when given). Returns (o [B, T, H, V] in q.dtype, final
  state [N, H, K, V] float32)."""
  return _recurrent(q, k, v, g, beta, u, initial_state, cu_seqlens, (float(scale), bool(interpret)),
                    reference)
