"""Gated delta rule on TPU, and the Mosaic kernel of the delta-rule class it heads: gated delta rule
(scalar gate), delta rule (no gate) and KDA (per-channel gate; delta_rule/tpu.py and kda/tpu.py
adapt onto `chunk_delta`), forward and backward under one `jax.custom_vjp` (the runner of
common/tpu/state_kernel). `interpret=True` runs it in TPU interpret mode on any host.

Grid (batch, head, chunk), dimension semantics ("parallel", "parallel", "arbitrary"). Per chunk of
C tokens, with G the chunk-local gate cumsum (computed outside; [C, 1] or [C, K]):
  A  = strict_lower(beta_i k_i . k_j exp(G_i - G_j)),  T = (I + A)^-1          (float32)
  w  = T (beta k exp(G)),  u = T (beta v),  v' = u - w S
  o  = scale (q exp(G)) S + lower(scale q_i . k_j exp(G_i - G_j)) v'
  S <- exp(G_C) S + (k exp(G_C - G))^T v'
The state S [K, V] lives in a float32 VMEM scratch carried across the chunk axis: loaded from the
initial state where a sequence starts (chunk 0, or per `flags` with cu_seqlens), written to the
final-state block of its sequence. With gradients, the forward also writes every chunk-start state
[B, H, N, K, V] (float32); the backward kernel walks the chunks in reverse through its index maps,
carrying dS in VMEM, recomputes the chunk's WY quantities and writes dq, dk, dv, dG, dbeta and the
initial-state gradient. The gate-cumsum gradient dG becomes dg through autodiff of the cumsum.
"""
from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp

from pallas_kernels.common.tpu import layout, state_kernel
from pallas_kernels.common.tpu.chunk_math import (F32, Decay, as_col, causal, dot, like,
                                                  state_decay, state_gate_grad, unit_lower_inverse)


class _Static(NamedTuple):
  N: int
  C: int
  scale: float
  interpret: object


class _Chunk(NamedTuple):
  dec: Decay
  kf: jnp.ndarray      # k in float32 [C, K]
  kb: jnp.ndarray      # beta k [C, K]
  eG: jnp.ndarray      # exp(G) [C, Kg]
  Tinv: jnp.ndarray    # (I + A)^-1 [C, C]
  w: jnp.ndarray       # [C, K] in the input dtype
  u: jnp.ndarray       # [C, V] in the input dtype
  Aqk: jnp.ndarray     # scaled causal q.k scores [C, C]
  G_last: jnp.ndarray  # G_C [1, Kg]
  k_out: jnp.ndarray   # k exp(G_C - G) [C, K] float32
  gamma: jnp.ndarray   # exp(G_C) as a column [Kg, 1] (scales the rows of S)


def _intra(q, k, v, G, beta, scale):
  """The state-independent part of a chunk (shared by the forward and the backward kernel)."""
  dt = q.dtype
  dec = Decay(G, G, dt)
  kf = k.astype(F32)
  kb = kf * beta
  Tinv = unit_lower_inverse(dec.scores(kb, k, strict=True))
  eG = jnp.exp(G)
  w = dot(Tinv, kb * eG, F32).astype(dt)
  u = dot(Tinv, v.astype(F32) * beta, F32).astype(dt)
  Aqk = dec.scores(q, k, strict=False) * scale
  return _Chunk(dec, kf, kb, eG, Tinv, w, u, Aqk, *state_decay(kf, G))


def _forward(st: _Static, xs, S):
  q, k, v, G, beta = xs[:3] + tuple(map(as_col, xs[3:]))
  dt = q.dtype
  c = _intra(q, k, v, G, beta, st.scale)
  v_new = c.u.astype(F32) - dot(c.w, S, dt)
  o = dot(q.astype(F32) * c.eG * st.scale, S, dt) + dot(c.Aqk, v_new, dt)
  return o, S * c.gamma + dot(c.k_out, v_new, dt, ta=True)


def _backward(st: _Static, xs, S, do, dS):
  q, k, v, G, beta = xs[:3] + tuple(map(as_col, xs[3:]))
  dt, scale = q.dtype, st.scale
  c = _intra(q, k, v, G, beta, scale)
  v_new = c.u.astype(F32) - dot(c.w, S, dt)
  qf = q.astype(F32)
  # Through S_next = gamma S + k_out^T v' and o = scale (q eG) S + Aqk v'.
  dv_new = dot(c.k_out, dS, dt) + dot(c.Aqk, do, dt, ta=True)
  dk_out = dot(v_new, dS, dt, tb=True)
  dqg = dot(do, S, dt, tb=True) * scale                       # d(q eG)
  dP = jnp.where(causal(st.C, False), dot(do, v_new, dt, tb=True), 0.0) * scale
  # Through v' = u - w S, u = T (beta v), w = T (beta k eG), T = (I + A)^-1.
  dw = -dot(dv_new, S, dt, tb=True)
  dS_prev = dS * c.gamma + dot(qf * c.eG * scale, do, dt, ta=True) - dot(c.w, dv_new, dt, ta=True)
  vb, kbG = v.astype(F32) * beta, c.kb * c.eG
  dvb = dot(c.Tinv, dv_new, F32, ta=True)
  dkbG = dot(c.Tinv, dw, F32, ta=True)
  dT = dot(dv_new, vb, F32, tb=True) + dot(dw, kbG, F32, tb=True)
  dA = -dot(dot(c.Tinv, dT, F32, ta=True), c.Tinv, F32, tb=True)
  dA = jnp.where(causal(st.C, True), dA, 0.0)
  # Through the decayed scores Aqk = scale scores(q, k) and A = scores(beta k, k).
  lq, rq = c.dec.left(dP, c.kf), c.dec.right(dP, qf)
  la, ra = c.dec.left(dA, c.kf), c.dec.right(dA, c.kb)
  dkb = la + dkbG * c.eG
  dq = dqg * c.eG + lq
  dk = dk_out * jnp.exp(c.G_last - G) + rq + ra + dkb * beta
  dbeta = (jnp.sum(c.kf * dkb, axis=1, keepdims=True)
           + jnp.sum(v.astype(F32) * dvb, axis=1, keepdims=True))
  dG = dqg * qf * c.eG + dkbG * kbG + qf * lq - c.kf * rq + c.kb * la - c.kf * ra
  dG = state_gate_grad(dG, dk_out, c.k_out, S, dS, c.G_last)
  return (dq, dk, dvb * beta, like(dG, xs[3]), like(dbeta, xs[4])), dS_prev


KERNEL = state_kernel.StateKernel("delta_rule", _forward, _backward)


def chunk_delta(q, k, v, g, beta, *, scale, initial_state, cu_seqlens=None, interpret=False,
                chunk_size: int = 64):
  """q, k [B, T, H, K]; v [B, T, H, V]; g None (delta rule), [B, T, H] (gated delta rule) or
  [B, T, H, K] (KDA) natural-log decays; beta [B, T, H]; initial_state [N, H, K, V].

  Returns (o [B, T, H, V] in q.dtype, final_state [N, H, K, V] float32).
  """
  p, qkv = layout.qkv_inputs(q, k, v, cu_seqlens, chunk_size)
  _, G = layout.log_gates(g, p, q.shape[2])
  xs = (*qkv, G, layout.to_rows(layout.to_kernel(beta, p, F32), p))
  o, final = state_kernel.run(KERNEL, _Static(p.N, p.C, float(scale), interpret), p, xs, initial_state)
  return layout.from_kernel(o, p), final


def chunk_gated_delta_rule(q, k, v, g, beta, *, scale, initial_state, cu_seqlens=None,
                           interpret=False):
  """q, k [B, T, H, K]; v [B, T, H, V]; g, beta [B, T, H] (g may also be [B, T, H, K]).

  Returns (o [B, T, H, V] in q.dtype, final_state [N, H, K, V] float32), exactly like xla.py.
  """
  return chunk_delta(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                     cu_seqlens=cu_seqlens, interpret=interpret)
