"""GLA on TPU, and the Mosaic kernel of the additive class it heads: GLA (per-channel gate), simple
GLA / retention / linear attention (scalar gate or none; their tpu.py adapt onto `chunk_additive`)
and RWKV-6 (per-channel gate, query reads the previous state, bonus u), forward and backward under
one `jax.custom_vjp` (the runner of common/tpu/state_kernel). `interpret=True` runs it in TPU
interpret mode on any host.

Grid (batch, head, chunk), dimension semantics ("parallel", "parallel", "arbitrary"). Per chunk,
with G the chunk-local gate cumsum and Gq = G (or G - g for RWKV-6), both computed outside:
  o  = scale (q exp(Gq)) S + scale scores(q, k) v  [+ scale (q . u k) v for RWKV-6]
  S <- exp(G_C) S + (k exp(G_C - G))^T v
scores(q, k)_ij = sum_c q_ic k_jc exp(Gq_ic - G_jc) on j <= i (j < i for RWKV-6); see
chunk_math.Decay. The float32 state lives in VMEM across the chunk axis; the backward kernel walks
the chunks in reverse with dS in VMEM, reading the chunk-start states the forward saved. The bonus
gradient du is a sum over tokens and is formed outside the kernel.
"""
from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp

from pallas_kernels.common.tpu import layout, state_kernel
from pallas_kernels.common.tpu.chunk_math import (F32, Decay, as_col, causal, dot, like,
                                                  state_decay, state_gate_grad)


class _Static(NamedTuple):
  N: int
  C: int
  scale: float
  rwkv: bool          # Gq and u are given
  interpret: object


def _unpack(st: _Static, xs):
  """q, k, v, G, Gq, u (Gq = G and u = None unless RWKV-6); gates as [C, 1] or [C, K]."""
  xs = xs[:3] + tuple(map(as_col, xs[3:5 if st.rwkv else 4])) + xs[5:]
  return xs if st.rwkv else (*xs, xs[3], None)


def _bonus(st, q, k, u):
  """scale (q_i . u k_i) [C, 1] for RWKV-6."""
  return jnp.sum(q.astype(F32) * u * k.astype(F32), axis=1, keepdims=True) * st.scale


def _forward(st: _Static, xs, S):
  q, k, v, G, Gq, u = _unpack(st, xs)
  dt = q.dtype
  A = Decay(Gq, G, dt, strict=st.rwkv).scores(q, k) * st.scale
  o = dot(A, v, dt) + dot(q.astype(F32) * jnp.exp(Gq) * st.scale, S, dt)
  if st.rwkv:
    o = o + _bonus(st, q, k, u) * v.astype(F32)
  _, k_out, gamma = state_decay(k.astype(F32), G)
  return o, S * gamma + dot(k_out, v, dt, ta=True)


def _backward(st: _Static, xs, S, do, dS):
  q, k, v, G, Gq, u = _unpack(st, xs)
  dt, scale = q.dtype, st.scale
  qf, kf = q.astype(F32), k.astype(F32)
  dec = Decay(Gq, G, dt, strict=st.rwkv)
  A = dec.scores(q, k) * scale
  G_last, k_out, gamma = state_decay(kf, G)
  eGq = jnp.exp(Gq)
  dv = dot(A, do, dt, ta=True) + dot(k_out, dS, dt)
  dk_out = dot(v, dS, dt, tb=True)
  dqg = dot(do, S, dt, tb=True) * scale                       # d(q exp(Gq))
  dA = jnp.where(causal(st.C, st.rwkv), dot(do, v, dt, tb=True), 0.0) * scale
  lq, rq = dec.left(dA, kf), dec.right(dA, qf)
  dq = dqg * eGq + lq
  dk = dk_out * jnp.exp(G_last - G) + rq
  if st.rwkv:
    dbonus = jnp.sum(do.astype(F32) * v.astype(F32), axis=1, keepdims=True) * scale
    dv = dv + _bonus(st, q, k, u) * do.astype(F32)
    dq = dq + dbonus * u * kf
    dk = dk + dbonus * u * qf
  dGq = dqg * qf * eGq + qf * lq                              # through the query-side cumsum
  dG = state_gate_grad(-kf * rq, dk_out, k_out, S, dS, G_last)  # through the key side and the state
  if G.shape[1] == 1:
    dGq = jnp.sum(dGq, axis=1, keepdims=True)
  if st.rwkv:
    grads = (dq, dk, dv, like(dG, xs[3]), like(dGq, xs[4]))
  else:
    grads = (dq, dk, dv, like(dG + dGq, xs[3]))
  return grads, dS * gamma + dot(qf * eGq * scale, do, dt, ta=True)


def _bonus_grad(st: _Static, xs, do):
  """du [H, 1, K] = sum over tokens of scale (do_i . v_i) q_i k_i."""
  q, k, v, u = xs[0], xs[1], xs[2], xs[5]
  dbonus = jnp.sum(do.astype(F32) * v.astype(F32), axis=-1, keepdims=True) * st.scale
  return (jnp.sum(dbonus * q.astype(F32) * k.astype(F32), axis=(0, 2))[:, None, :].astype(u.dtype),)


ADDITIVE = state_kernel.StateKernel("additive", _forward, _backward)
RWKV6 = state_kernel.StateKernel("rwkv6", _forward, _backward, _bonus_grad)


def chunk_additive(q, k, v, g, *, scale, initial_state, cu_seqlens=None, u=None,
                   interpret=False, chunk_size: int = 64):
  """q, k [B, T, H, K]; v [B, T, H, V]; g None, [B, T, H] or [B, T, H, K] log decays; u None, or
  the RWKV-6 bonus [H, K] (then o_t reads S_{t-1}). Same contract as gla/xla.chunk_gla.

  Returns (o [B, T, H, V] in q.dtype, final_state [N, H, K, V] float32).
  """
  p, qkv = layout.qkv_inputs(q, k, v, cu_seqlens, chunk_size)
  g, G = layout.log_gates(g, p, q.shape[2])
  xs = (*qkv, G)
  if u is not None:
    xs += (G - g, u.astype(F32)[:, None, :])
  st = _Static(p.N, p.C, float(scale), u is not None, interpret)
  o, final = state_kernel.run(ADDITIVE if u is None else RWKV6, st, p, xs, initial_state)
  return layout.from_kernel(o, p), final


def chunk_gla(q, k, v, g, *, scale, initial_state, cu_seqlens=None, interpret=False):
  """q, k [B, T, H, K]; v [B, T, H, V]; g [B, T, H, K] log decays (a scalar [B, T, H] gate also
  works).

  Returns (o [B, T, H, V] in q.dtype, final_state [N, H, K, V] float32), exactly like xla.py.
  """
  return chunk_additive(q, k, v, g, scale=scale, initial_state=initial_state,
                        cu_seqlens=cu_seqlens, interpret=interpret)
