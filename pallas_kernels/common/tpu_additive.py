"""Mosaic TPU kernels for the additive class: GLA (per-channel gate), simple GLA / retention / linear
attention (scalar gate or none) and RWKV-6 (per-channel gate, query reads the previous state, bonus
u), forward and backward under one `jax.custom_vjp`.

Grid (batch, head, chunk), dimension semantics ("parallel", "parallel", "arbitrary"). Per chunk,
with G the chunk-local gate cumsum and Gq = G (or G - g for RWKV-6), both computed outside:
  o  = scale (q exp(Gq)) S + scale scores(q, k) v  [+ scale (q . u k) v for RWKV-6]
  S <- exp(G_C) S + (k exp(G_C - G))^T v
scores(q, k)_ij = sum_c q_ic k_jc exp(Gq_ic - G_jc) on j <= i (j < i for RWKV-6); see tpu_math.Decay.
The float32 state lives in VMEM across the chunk axis; the backward kernel walks the chunks in
reverse with dS in VMEM, reading the chunk-start states the forward saved. The bonus gradient du is
a sum over tokens and is formed outside the kernel.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental.pallas import tpu as pltpu

from pallas_kernels.common import tpu_layout as tl
from pallas_kernels.common.tpu_math import F32, Decay, causal, dot, state_decay, state_gate_grad


class _Static(NamedTuple):
  N: int
  C: int
  scale: float
  rwkv: bool          # Gq and u are given
  interpret: object


def _chunk_inputs(st: _Static, refs):
  """q, k, v, G, Gq, u (Gq = G and u = None unless RWKV-6) and the number of refs consumed."""
  q, k, v, G = (r[...] for r in refs[:4])
  if st.rwkv:
    return q, k, v, G, refs[4][...], refs[5][...], 6
  return q, k, v, G, G, None, 4


def _bonus(st, q, k, u):
  """scale (q_i . u k_i) [C, 1] for RWKV-6."""
  return jnp.sum(q.astype(F32) * u * k.astype(F32), axis=1, keepdims=True) * st.scale


def _forward_kernel(st: _Static, with_states: bool, seq_ref, flags_ref, *refs):
  del seq_ref
  q, k, v, G, Gq, u, i = _chunk_inputs(st, refs)
  h0_ref, o_ref, final_ref, rest = refs[i], refs[i + 1], refs[i + 2], refs[i + 3:]
  states_ref, S_ref = rest if with_states else (None, rest[0])
  tl.load_initial_state(S_ref, h0_ref, flags_ref)
  S = S_ref[...]
  if with_states:
    states_ref[...] = S
  dt = q.dtype
  A = Decay(Gq, G, dt, strict=st.rwkv).scores(q, k) * st.scale
  o = dot(A, v, dt) + dot(q.astype(F32) * jnp.exp(Gq) * st.scale, S, dt)
  if st.rwkv:
    o = o + _bonus(st, q, k, u) * v.astype(F32)
  o_ref[...] = o.astype(o_ref.dtype)
  _, k_out, gamma = state_decay(k.astype(F32), G)
  S = S * gamma + dot(k_out, v, dt, ta=True)
  S_ref[...] = S
  final_ref[...] = S


def _backward_kernel(st: _Static, seq_ref, flags_ref, *refs):
  del seq_ref
  q, k, v, G, Gq, u, i = _chunk_inputs(st, refs)
  S_in_ref, do_ref, dfinal_ref = refs[i:i + 3]
  outs, dS_ref = refs[i + 3:-1], refs[-1]
  tl.load_final_state_grad(dS_ref, dfinal_ref, flags_ref, st.N)
  dS, S, do = dS_ref[...], S_in_ref[...], do_ref[...]
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
  grads = (dq, dk, dv, dG, dGq) if st.rwkv else (dq, dk, dv, dG + dGq)
  for ref, x in zip(outs, grads):
    ref[...] = x.astype(ref.dtype)
  dS_prev = dS * gamma + dot(qf * eGq * scale, do, dt, ta=True)
  dS_ref[...] = dS_prev
  outs[-1][...] = dS_prev


def _in_specs(st: _Static, K, V, Kg, reverse=False):
  specs = tl.chunk_specs(st.C, (K, K, V, Kg), reverse, st.N)
  if st.rwkv:
    specs += [tl.chunk_spec(st.C, Kg, reverse, st.N),
              tl.head_spec((1, K))]
  return specs


def _forward(st: _Static, seq, flags, xs, h0, with_states: bool):
  q, v = xs[0], xs[2]
  B, H, Tp, K = q.shape
  V, Kg = v.shape[-1], xs[3].shape[-1]
  out_specs = [tl.chunk_spec(st.C, V), tl.state_spec((K, V))]
  out_shape = [jax.ShapeDtypeStruct((B, H, Tp, V), q.dtype), jax.ShapeDtypeStruct(h0.shape, F32)]
  if with_states:
    out_specs.append(tl.per_chunk_spec((K, V)))
    out_shape.append(jax.ShapeDtypeStruct((B, H, st.N, K, V), F32))
  call = tl.call(functools.partial(_forward_kernel, st, with_states), (B, H, st.N), seq, flags,
                 _in_specs(st, K, V, Kg) + [tl.state_spec((K, V))], out_specs, out_shape,
                 [pltpu.VMEM((K, V), F32)], st.interpret, "additive_fwd")
  return call(*xs, h0)


def _backward(st: _Static, seq, flags, xs, states, do, dfinal):
  q, v = xs[0], xs[2]
  B, H, Tp, K = q.shape
  V, Kg, N = v.shape[-1], xs[3].shape[-1], st.N
  in_specs = _in_specs(st, K, V, Kg, True) + [
      tl.per_chunk_spec((K, V), True, N), tl.chunk_spec(st.C, V, True, N),
      tl.state_spec((K, V), True, N)]
  grads = xs[:5] if st.rwkv else xs[:4]
  out_specs = tl.chunk_specs(st.C, [x.shape[-1] for x in grads], True, N)
  out_specs.append(tl.state_spec((K, V), True, N))
  call = tl.call(functools.partial(_backward_kernel, st), (B, H, N), seq, flags, in_specs,
                 out_specs, tl.shapes_like(*grads, dfinal), [pltpu.VMEM((K, V), F32)],
                 st.interpret, "additive_bwd")
  return call(*xs, states, do, dfinal)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _core(st, seq, flags, empty, xs, h0):
  return _forward(st, seq, flags, xs, h0, with_states=False)


def _core_fwd(st, seq, flags, empty, xs, h0):
  o, final, states = _forward(st, seq, flags, xs, h0, with_states=True)
  return (o, final), (seq, flags, empty, xs, states)


def _core_bwd(st, res, cts):
  seq, flags, empty, xs, states = res
  do, dfinal = cts
  *grads, dh0 = _backward(st, seq, flags, xs, states, do, dfinal)
  dh0 = jnp.where(empty[:, None, None, None], 0.0, dh0)  # never visited by the kernel
  if st.rwkv:  # du [H, 1, K] = sum over tokens of scale (do_i . v_i) q_i k_i
    q, k, v, u = xs[0], xs[1], xs[2], xs[5]
    dbonus = jnp.sum(do.astype(F32) * v.astype(F32), axis=-1, keepdims=True) * st.scale
    du = jnp.sum(dbonus * q.astype(F32) * k.astype(F32), axis=(0, 2))[:, None, :].astype(u.dtype)
    grads.append(du)
  return None, None, None, tuple(grads), dh0


_core.defvjp(_core_fwd, _core_bwd)


def chunk_additive(q, k, v, g, *, scale, initial_state=None, cu_seqlens=None, u=None,
                   interpret=False, chunk_size: int = 64):
  """q, k [B, T, H, K]; v [B, T, H, V]; g None, [B, T, H] or [B, T, H, K] log decays; u None, or
  the RWKV-6 bonus [H, K] (then o_t reads S_{t-1}). Same contract as gla/xla.chunk_gla.

  Returns (o [B, T, H, V] in q.dtype, final_state [N, H, K, V] float32).
  """
  B, T, H, K = q.shape
  dt = q.dtype
  p = tl.plan(B, T, cu_seqlens, chunk_size)
  h0 = (jnp.zeros((p.n_seq, H, K, v.shape[-1]), F32) if initial_state is None
        else initial_state.astype(F32))
  g = tl.to_kernel(jnp.zeros((B, T, H), F32) if g is None else g, p, F32)
  G = tl.chunk_cumsum(g, p)
  xs = (tl.to_kernel(q, p), tl.to_kernel(k, p, dt), tl.to_kernel(v, p, dt), G)
  if u is not None:
    xs += (G - g, u.astype(F32)[:, None, :])
  st = _Static(p.N, p.C, float(scale), u is not None, interpret)
  o, final = _core(st, p.seq, p.flags, p.empty, xs, h0)
  return tl.from_kernel(o, p), tl.passthrough_empty(final, h0, p.empty)
